"""`accumulate="auto"` under a budget that forces 4 micro-batches, on the 12-block GPT of
`benchmarks.memory_budget` (layers in an `nn.ModuleList`, width 256, 128 tokens; dropout set to 0
so both runs draw no random numbers), fp32 on the CPU (saved-activation bytes are exact on any
device).

The budget: parameters + gradients + optimizer state + what the forward saves with every block
checkpointed (each block run through `torch.utils.checkpoint` by hand, not by autoopt) on a quarter
of a batch, halfway to a quarter plus one sample: a quarter fits, more does not, and checkpointing
alone cannot fit the whole batch. Then one epoch (`--batches` batches of `--batch` sequences,
cross-entropy, SGD with momentum):

* plain torch on the full batches, no limit;
* the same loop, unchanged, after `autoopt.optimize(..., accumulate="auto", memory_budget=budget)`:
  every micro-batch's forward is measured with `saved_tensor_bytes` (autograd's saved tensors plus
  the selective checkpoints' caches); the step holds state + that, checked against the budget.

Reported: the micro-batches per batch, the step's bytes against the budget (and what the plain
full-batch step holds), the max abs difference of the parameters after the epoch, the epoch times.
SGD, not AdamW: Adam's first steps divide by |gradient|, which turns fp32 summation noise on
near-zero gradients into lr-sized differences and says nothing about the gradients.

Usage: `python -m benchmarks.accumulate_budget [--batches 4] [--batch 16] [--markdown out.md]`.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import autoopt
from autoopt.runtime.memory import format_bytes, saved_tensor_bytes, state_memory
from benchmarks.memory_budget import GPT, SEQ, VOCAB

PARTS = 4


class Checkpointed(nn.Module):
    """A block run through `torch.utils.checkpoint`: what the least any plan saves looks like."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, mask, use_reentrant=False)


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = GPT()
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


def _data(batches: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (batches * batch, SEQ + 1), generator=g)
    return [
        (tokens[i : i + batch, :-1].clone(), tokens[i : i + batch, 1:].clone())
        for i in range(0, len(tokens), batch)
    ]


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, saved: list[int]) -> torch.Tensor:
    out: list[torch.Tensor] = []
    saved.append(saved_tensor_bytes(lambda: out.append(model(x))))
    return F.cross_entropy(out[0].flatten(0, 1), y.flatten())


def measure(batches: int, batch: int) -> dict[str, Any]:
    data = _data(batches, batch)
    plain, auto = _model(), _model()
    all_full = copy.deepcopy(plain)
    all_full.blocks = nn.ModuleList(Checkpointed(b) for b in all_full.blocks)
    x0 = data[0][0]
    quarter = batch // PARTS
    state = state_memory(plain, _optimizer(plain)).state
    saved = [saved_tensor_bytes(lambda n=n: all_full(x0[:n])) for n in (quarter, quarter + 1)]
    budget = state + sum(saved) // 2

    opt = _optimizer(plain)
    plain_saved: list[int] = []
    start = time.perf_counter()
    for x, y in data:
        opt.zero_grad()
        _loss(plain, x, y, plain_saved).backward()
        opt.step()
    plain_s = time.perf_counter() - start

    opt = _optimizer(auto)
    auto, loader, opt = autoopt.optimize(
        auto,
        data,
        opt,
        accumulate="auto",
        memory_budget=budget,
        amp=False,
        compile=False,
        channels_last=False,
        verbose=False,
    )
    auto_saved: list[int] = []
    rows: list[int] = []
    start = time.perf_counter()
    for x, y in loader:  # the same loop, unchanged
        rows.append(len(x))
        opt.zero_grad()
        _loss(auto, x, y, auto_saved).backward()
        opt.step()
    auto_s = time.perf_counter() - start
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(plain.parameters(), auto.parameters(), strict=True)
    )
    report = autoopt.report(auto)
    return {
        "batches": batches,
        "batch": batch,
        "budget": budget,
        "state": state,
        "plain_step": state + max(plain_saved),
        "auto_step": state + max(auto_saved),
        "rows": rows,
        "diff": diff,
        "plain_s": plain_s,
        "auto_s": auto_s,
        "accumulate": report["accumulate"].detail,
        "checkpoint": report["checkpoint"].detail,
    }


def markdown(r: dict[str, Any]) -> str:
    fits = "yes" if r["auto_step"] <= r["budget"] else "no"
    return "\n".join(
        [
            "| budget | plain step holds | auto step holds (largest micro-batch) | fits | "
            "micro-batch sizes (rows, in order) | max abs param diff | epoch s (plain) | "
            "epoch s (auto) |",
            "|---|---|---|---|---|---|---|---|",
            f"| {format_bytes(r['budget'])} | {format_bytes(r['plain_step'])} | "
            f"{format_bytes(r['auto_step'])} | {fits} | {' '.join(map(str, r['rows']))} | "
            f"{r['diff']:.1e} | {r['plain_s']:.1f} | {r['auto_s']:.1f} |",
            "",
            f"Report, accumulate: `{r['accumulate']}`",
            "",
            f"Report, checkpoint: `{r['checkpoint']}`",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--markdown", help="write the table here too")
    parser.add_argument("--check", action="store_true", help="exit 1 unless it fits and matches")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = measure(args.batches, args.batch)
    table = markdown(result)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    ok = result["auto_step"] <= result["budget"] and result["diff"] <= 1e-5
    if args.check and not ok:
        print("FAIL: the step exceeds the budget or the parameters differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
