"""The memory plan checked against a measurement that shares no code with the planner.

The planner (and every figure in docs/benchmarks/memory.md before this) counts bytes with
autoopt's own counters: parameter/gradient/optimizer-state sizes and saved-tensor hooks. Here the
peak of a real training step is read from torch's profiler instead: with `profile_memory=True`
every CPU allocation and free is recorded with the allocator's running total of the bytes it
handed out since profiling began (`total_allocated`, the field torch's own memory timeline
reads). The step's peak is the tensors resident when it starts (distinct storages of the
parameters, gradients and optimizer state, read from torch) plus the highest running total.

Two loops: `zero_grad()` (gradients freed between steps, the default `set_to_none=True`) and
`zero_grad(set_to_none=False)` (gradients resident through the forward, as the plan assumes).

Usage: `python -m benchmarks.memory_measured [--fractions 1 0.333] [--markdown out.md]`.
"""

from __future__ import annotations

import argparse
import copy
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import autoopt
from autoopt.diagnostics.measured_memory import allocated_peak, resident
from autoopt.runtime.checkpointing.checkpoint_plan import memory_plan
from autoopt.runtime.memory import format_bytes, saved_tensor_bytes, state_memory


def measured_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple[Any, Any], set_to_none: bool
) -> int:
    """Peak bytes of one step (forward, cross-entropy, backward, step, zero_grad) measured by
    torch's profiler, plus what was resident when it began."""
    x, y = batch

    def step() -> None:
        torch.manual_seed(1)
        out = model(x)
        F.cross_entropy(out.flatten(0, -2), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=set_to_none)

    return resident(model, optimizer) + allocated_peak(step)


def planned_and_measured(
    model: nn.Module,
    batch: tuple[Any, Any],
    fraction: float,
    set_to_none: bool,
) -> dict[str, Any]:
    """optimize() `model` under a budget of its state plus `fraction` of eager's activations;
    after a first step (which plans, and allocates AdamW's state), one step measured."""
    x, y = batch
    state = state_memory(model, torch.optim.AdamW(model.parameters())).state
    eager_saved = saved_tensor_bytes(lambda: model(x))
    planned = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(planned.parameters(), lr=1e-4)
    planned, optimizer = autoopt.optimize(
        planned,
        None,
        optimizer,
        amp=False,
        compile=False,
        channels_last=False,
        memory_budget=state + int(fraction * eager_saved),
        verbose=False,
    )
    F.cross_entropy(planned(x).flatten(0, -2), y.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=set_to_none)
    plan = memory_plan(planned)
    assert plan is not None, "no memory plan: the budget did not reach the planner"
    measured = measured_step(planned, optimizer, batch, set_to_none)
    return {
        "fraction": fraction,
        "zero_grad": "set_to_none" if set_to_none else "keep grads",
        "blocks": plan.blocks() or "none",
        "planned": plan.peak,
        "planned_gradients": plan.after.gradients,
        "measured": measured,
        "ratio": plan.peak / measured,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table for docs/benchmarks/memory.md."""
    lines = [
        "| activations kept | zero_grad | checkpointed | planned peak | measured peak | planned/measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fraction']:.2f} | {r['zero_grad']} | {r['blocks']} | "
            f"{format_bytes(r['planned'])} | {format_bytes(r['measured'])} | {r['ratio']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure the memory-budget benchmark's GPT at a few budgets, both zero_grad styles."""
    from benchmarks import memory_budget

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[1.0, 1 / 3])
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for fraction in args.fractions:
        for set_to_none in (False, True):
            torch.manual_seed(0)
            model = memory_budget.GPT()
            row = planned_and_measured(model, memory_budget._batch(0), fraction, set_to_none)
            rows.append(row)
            print(row, flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
