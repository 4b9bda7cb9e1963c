"""How one block of a stack runs: plainly, fully checkpointed, or selectively checkpointed.

A block of an `nn.ModuleList` is called by its parent's forward, so checkpointing it means
patching the block's own `forward` (in place: its class, parameters and `state_dict` keys stay).
The patched forward runs `torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False,
**kwargs)` in training (grad enabled, block in training mode) and the plain forward otherwise;
any positional and keyword arguments (attention masks) pass through.

* Full: only the block's inputs are kept; backward recomputes the whole block.
* Selective (`create_selective_checkpoint_contexts`): the outputs of matmuls, convolutions and
  attention are kept (`KeepMatmuls`), the cheap pointwise ops between them (norms,
  activations, dropout, residual adds) are recomputed.

Both preserve the RNG state, so dropout masks in the recomputation equal the first pass and the
gradients equal eager's; batch-norm running statistics are restored after the recomputation,
so they are updated once per step, as in eager.

A checkpointed block gets no KV cache (a transformers `Cache` passed to it, as GPT-2, Llama and
T5 layers take one with the default `use_cache=True`): the recomputation would write into it a
second time. It runs with the cache left out and `use_cache=False`, as transformers' own
gradient checkpointing does (`GradientCheckpointingLayer`), which is exact while the cache holds
nothing yet at the block's layer (a cache made by this forward); a block whose layer already holds
cached states runs plainly that step, with a warning.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from autoopt.runtime.context import Forward
from autoopt.runtime.memory import count_saved
from autoopt.runtime.trials.choices import default_clock
from autoopt.runtime.trials.replay import in_trial

STATE_ATTR = "_autoopt_checkpoint_block"  # the BlockState, on each patched block

_aten = torch.ops.aten
# The ops whose outputs selective checkpointing keeps: the costly ones (as torchtitan's policy).
# Overloads missing from a build are left out.
KEEP_OPS = frozenset(
    getattr(_aten, name).default
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    if hasattr(_aten, name)
)


class Mode(str, Enum):
    PLAIN = "plain"
    SELECTIVE = "selective"
    FULL = "full"


class BlockMeasurer(Protocol):
    """What a block asks of the "auto" plan (`checkpoint_plan.Planner`) while it is measuring:
    the plan is handed down to the blocks, so they need not import it."""

    measuring: bool

    def measure(
        self,
        state: BlockState,
        forward: Forward,
        block: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any: ...


@dataclass
class BlockState:
    """What one block's patched forward does; kept on the block as `_autoopt_checkpoint`.
    `planner` is set while "auto" has not decided yet (its first training forward measures)."""

    stack: str  # the qualified name of the container ("" for the model itself)
    index: int  # the block's position in it
    mode: Mode = Mode.PLAIN
    planner: BlockMeasurer | None = None
    # Hears the seconds each recomputation of the block takes, while the plan's cost is
    # measured (the first steps after it is made); None otherwise.
    recomputed: Callable[[float], None] | None = None

    @property
    def name(self) -> str:
        return f"{self.stack}.{self.index}" if self.stack else str(self.index)


class KeepMatmuls:
    """Selective-checkpoint policy: keep the outputs of `KEEP_OPS`, recompute the rest. The
    kept outputs live in the checkpoint's cache, not in autograd's saved tensors, so they are
    reported to `count_saved` (a running `saved_tensor_bytes` counts them)."""

    def __call__(
        self, ctx: SelectiveCheckpointContext, func: Any, *args: Any, **kwargs: Any
    ) -> CheckpointPolicy:
        if func not in KEEP_OPS:
            return CheckpointPolicy.PREFER_RECOMPUTE
        output = getattr(ctx, "op_output", None)
        for t in output if isinstance(output, tuple | list) else (output,):
            if isinstance(t, torch.Tensor):
                count_saved(t)
        return CheckpointPolicy.MUST_SAVE


_eval_checkpointing = 0  # open `checkpointed_in_eval` contexts


@contextlib.contextmanager
def checkpointed_in_eval() -> Iterator[None]:
    """Inside, blocks run as their mode says in eval mode too: `accumulate="auto"` trains its
    probes in eval mode (no dropout, so a row's output is the same alone and in a pair) and they
    must hold no more than a training step does."""
    global _eval_checkpointing
    _eval_checkpointing += 1
    try:
        yield
    finally:
        _eval_checkpointing -= 1


def checkpoints_now(module: nn.Module) -> bool:
    """Whether a checkpointed `module` recomputes in this forward: grad enabled, and training
    (or inside `checkpointed_in_eval`)."""
    return torch.is_grad_enabled() and (module.training or _eval_checkpointing > 0)


class BlockCheckpoint:
    """A block's forward layer: plain, selective or full as its state says, in training only."""

    def __init__(self, forward: Forward, block: nn.Module, state: BlockState) -> None:
        self.forward = forward
        self.block = block
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not checkpoints_now(self.block):
            return self.forward(*args, **kwargs)
        planner = self.state.planner
        if planner is not None and planner.measuring and not in_trial():
            return planner.measure(self.state, self.forward, self.block, args, kwargs)
        state = self.state
        return run_block(self.forward, self.block, state.mode, args, kwargs, state.recomputed)


def run_block(
    forward: Forward,
    block: nn.Module,
    mode: Mode,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    recomputed: Callable[[float], None] | None = None,
) -> Any:
    """`forward(*args, **kwargs)` of `block`, checkpointed as `mode` says (without a KV cache,
    see the module docstring); `recomputed` hears the seconds of its recomputation (not
    under torch.compile, which traces the checkpoint as one graph)."""
    if mode is Mode.PLAIN:
        return forward(*args, **kwargs)
    if recomputed is not None and not torch.compiler.is_compiling():
        forward = _Timed(forward, recomputed)
    uncached = without_cache(block, args, kwargs)
    if uncached is None:
        warnings.warn(
            f"autoopt checkpoint: the KV cache passed to {type(block).__name__} already holds "
            "states at its layer; the block runs without checkpointing (leaving the cache out "
            "would change its output)",
            stacklevel=2,
        )
        return forward(*args, **kwargs)
    args, kwargs = uncached
    contexts = checkpoint_contexts([block], selective=mode is Mode.SELECTIVE)
    if contexts is not None:
        kwargs = {"context_fn": contexts, **kwargs}
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


class _Timed:
    """A block's forward as a checkpoint calls it: the first call is the forward, a later one
    the recomputation in backward, whose seconds go to `recomputed` (an early stop of the
    recomputation raises inside it: counted too)."""

    def __init__(self, forward: Forward, recomputed: Callable[[float], None]) -> None:
        self.forward = forward
        self.recomputed = recomputed
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            return self.forward(*args, **kwargs)
        start = default_clock()
        try:
            return self.forward(*args, **kwargs)
        finally:
            self.recomputed(default_clock() - start)


CACHE_KWARGS = ("past_key_values", "past_key_value", "layer_past")


def is_kv_cache(obj: object) -> bool:
    """A transformers `Cache` (DynamicCache, EncoderDecoderCache, ...), told without importing
    transformers."""
    return any(
        c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(obj).__mro__
    )


def without_cache(
    block: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The block's arguments with every KV cache among them replaced by None and `use_cache`
    set to False (what transformers passes a checkpointed layer); the arguments unchanged when
    they hold no cache. None when a cache already holds states at the block's layer (or its
    layer cannot be told): leaving it out would change the block's output."""
    positions = [i for i, a in enumerate(args) if is_kv_cache(a)]
    keys = [k for k, v in kwargs.items() if is_kv_cache(v)]
    if not positions and not keys:
        return args, kwargs
    layer = layer_index(block)
    caches = [args[i] for i in positions] + [kwargs[k] for k in keys]
    if layer is None or not all(_empty_at(cache, layer) for cache in caches):
        return None
    args = tuple(None if i in positions else a for i, a in enumerate(args))
    kwargs = {k: None if k in keys else v for k, v in kwargs.items()}
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    return args, kwargs


def layer_index(block: nn.Module) -> int | None:
    """The cache layer a transformers block writes: the `layer_idx` of its attention."""
    for module in block.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int):
            return index
    return None


def _empty_at(cache: Any, layer: int) -> bool:
    """Whether `cache` holds no states for `layer` yet (self-attention, and for an
    encoder-decoder cache the cross-attention too)."""
    try:
        if cache.get_seq_length(layer):
            return False
    except Exception:  # a cache without per-layer lengths: not provably empty
        return False
    updated = getattr(cache, "is_updated", None)
    return not (isinstance(updated, dict) and updated.get(layer))


def checkpoint_contexts(
    modules: list[nn.Module], selective: bool
) -> Callable[[], tuple[Any, Any]] | None:
    """The `context_fn` of a checkpoint over `modules` (None: torch's default): selective
    (`KeepMatmuls`) or not, with the batch norms' statistics restored after the recomputation.
    What dynamo can trace: a module-level function, or a `functools.partial` of one; an object
    with a `__call__`, a closure, or torch's `noop_context_fn` read as a global made
    torch.compile fail on the checkpoint ("checkpoint not implemented for ... context_fn").
    With batch norms the partial holds modules, which dynamo cannot guard on as constants: it
    runs that checkpoint outside the graph (a graph break), which restores the statistics."""
    norms = tuple(training_norms(modules))
    if selective:
        return functools.partial(_with_norms, _selective, norms) if norms else _selective
    return functools.partial(_with_norms, noop_context_fn, norms) if norms else None


def _selective() -> tuple[Any, Any]:
    return create_selective_checkpoint_contexts(KeepMatmuls())


def _with_norms(
    contexts: Callable[[], tuple[Any, Any]], norms: tuple[_BatchNorm, ...]
) -> tuple[Any, Any]:
    """`contexts()`, with the batch-norm statistics restored after the recomputation."""
    forward, recompute = contexts()
    # Outermost, so its clones and copies run outside the checkpoint's dispatch mode.
    return forward, _both(keep_running_stats(list(norms)), recompute)


@contextlib.contextmanager
def _both(first: Any, second: Any) -> Iterator[None]:
    """Enter `first`, then `second`; leave in reverse."""
    with first, second:
        yield


def training_norms(modules: list[nn.Module]) -> list[_BatchNorm]:
    """The batch norms inside `modules` that update running statistics in this forward."""
    return [
        m
        for top in modules
        for m in top.modules()
        if isinstance(m, _BatchNorm) and m.track_running_stats and m.training
    ]


@contextlib.contextmanager
def keep_running_stats(norms: list[_BatchNorm]) -> Iterator[None]:
    """Undo the running-statistics update that the batch norms make inside this context."""
    saved = [
        [b.clone() if b is not None else None for b in (m.running_mean, m.running_var)]
        + [m.num_batches_tracked.clone() if m.num_batches_tracked is not None else None]
        for m in norms
    ]
    try:
        yield
    finally:
        with torch.no_grad():
            for m, (mean, var, count) in zip(norms, saved, strict=True):
                for live, old in (
                    (m.running_mean, mean),
                    (m.running_var, var),
                    (m.num_batches_tracked, count),
                ):
                    if live is not None and old is not None:
                        live.copy_(old)
