"""`explain_memory()`: the memory plan `optimize()` would make for a model on one batch, without
training it. `autoopt doctor --model ... --input ...` prints it.

It runs `optimize(checkpoint="auto")` on a copy of the model and makes the checkpoint plan on
the batch (`autoopt.runtime.checkpointing.checkpoint_plan.plan`): the same measurement and the same decision
as the first training step, so what it shows is what training would do. With no budget (the
CPU's "auto") every block is still measured, and none is checkpointed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoopt.runtime.checkpointing.block_checkpoint import Mode
from autoopt.runtime.checkpointing.checkpoint_plan import BlockCost, plan
from autoopt.runtime.loading.batch import map_tensors
from autoopt.runtime.memory import (
    MemoryPlan,
    format_bytes,
    parse_budget,
    resident_bytes,
    resolve_budget,
    saved_tensor_bytes,
    state_memory,
)
from autoopt.runtime.optimize import optimize, report
from autoopt.runtime.passes import device as device_pass

# A budget no step reaches: the planner measures every block and checkpoints none.
_UNREACHABLE = 1 << 62


@dataclass(frozen=True)
class BlockMemory:
    """One block of a repeated stack: what it saves for backward each way, and its mode."""

    name: str
    type: str
    cost: BlockCost
    mode: Mode


@dataclass(frozen=True)
class MemoryExplanation:
    """The memory plan of one training step on one device: the step's bytes before and after
    checkpointing under `memory.budget`, each block's costs, and the checkpoint pass's line (which
    blocks, or why none)."""

    memory: MemoryPlan
    blocks: list[BlockMemory]
    decision: str
    optimizer: str  # the optimizer whose state is counted, e.g. "AdamW (assumed)"

    def render(self) -> list[str]:
        """Text lines: the block table, then the step before and after."""
        lines = [f"optimizer state of {self.optimizer}"]
        if self.blocks:
            rows = [("block", "type", "plain", "selective", "full", "mode")]
            rows += [
                (
                    b.name,
                    b.type,
                    format_bytes(b.cost.plain),
                    format_bytes(b.cost.selective),
                    format_bytes(b.cost.full),
                    b.mode.value,
                )
                for b in self.blocks
            ]
            widths = [max(len(row[i]) for row in rows) for i in range(6)]
            lines.append("saved for backward per block (plain / selective / full checkpoint)")
            lines += [
                "  " + "  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=True)) for r in rows
            ]
        lines += [*self.memory.render(), f"checkpoint: {self.decision}"]
        return [line.rstrip() for line in lines]

    def to_dict(self) -> dict[str, Any]:
        """Plain data, in bytes."""
        return {
            **self.memory.to_dict(),
            "optimizer": self.optimizer,
            "decision": self.decision,
            "blocks": [
                {
                    "name": b.name,
                    "type": b.type,
                    "plain": b.cost.plain,
                    "selective": b.cost.selective,
                    "full": b.cost.full,
                    "mode": b.mode.value,
                }
                for b in self.blocks
            ],
        }


def explain_memory(
    model: nn.Module,
    batch: Any,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    memory_budget: int | str | None = "auto",
    **options: Any,
) -> MemoryExplanation:
    """What one training step of `model` on `batch` holds per device, and what
    `checkpoint="auto"` would checkpoint to bring it under `memory_budget`.

    `batch` is the forward's argument, a tuple of its positional arguments, or a dict of its
    keyword arguments (`model(**batch)`, as transformers models take them). The optimizer's
    state is counted (AdamW's when none is given). `options` are further `optimize()` options
    the training uses (`device`, `amp`: autocast changes what is saved). Runs on a copy: the
    model, the optimizer and the RNG state are left as they were."""
    budget_option = parse_budget(memory_budget)
    device, _why = device_pass.choose(options.get("device", "auto"), model)
    unlimited = resolve_budget(budget_option, device) is None  # None, or "auto" off CUDA
    subject, subject_optimizer = copy.deepcopy((model, optimizer))
    named = "AdamW (assumed)" if optimizer is None else type(optimizer).__name__
    if subject_optimizer is None:
        subject_optimizer = torch.optim.AdamW(subject.parameters())
    settings = {"compile": False, "distributed": False, **options, "verbose": False}
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        subject, _ = optimize(
            subject,
            None,
            subject_optimizer,
            checkpoint="auto",
            memory_budget=_UNREACHABLE if unlimited else budget_option,
            **settings,
        )
        if isinstance(batch, Mapping):  # keyword arguments, as transformers models take them
            args, kwargs = (), map_tensors(dict(batch), lambda t: t.to(device))
        else:
            args = map_tensors(
                batch if isinstance(batch, tuple) else (batch,), lambda t: t.to(device)
            )
            kwargs = {}
        made = plan(subject, *args, **kwargs)
        decision = report(subject)["checkpoint"].detail
        if made is None:  # no block stack, or the measurement failed: the forward as a whole
            held = resident_bytes(subject, subject_optimizer, device)
            budget = resolve_budget(budget_option, device, held=held)
            state = state_memory(subject, subject_optimizer)
            step = state.with_activations(saved_tensor_bytes(lambda: subject(*args, **kwargs)))
            return MemoryExplanation(MemoryPlan(step, step, budget), [], decision, named)
    budget = None if unlimited else made.budget
    if unlimited:
        decision = "no memory budget: no block checkpointed"
    blocks = [
        BlockMemory(name, type(subject.get_submodule(name)).__name__, cost, made.modes[name])
        for name, cost in made.costs.items()
    ]
    return MemoryExplanation(MemoryPlan(made.before, made.after, budget), blocks, decision, named)
