"""FSDP2 against DDP and one process: the same losses, half the per-rank state (issue 10).

The model: an input Linear, BLOCKS residual blocks (`Linear(WIDTH, WIDTH)` + tanh) in an
`nn.ModuleList`, an output Linear; AdamW; STEPS steps on a global batch of GLOBAL_BATCH samples.
Three runs of the same training:

* one process on the global batch (plain torch, no autoopt): the reference losses;
* 2 processes (torchrun, gloo on CPU), `optimize(distributed="ddp")`, half the batch per rank;
* 2 processes, `optimize(distributed="fsdp")`.

Reported: the largest relative difference of the per-step global loss (mean over ranks) from
the one-process loss, and the bytes one rank holds of parameters, gradients and AdamW state after
the last step (`autoopt.runtime.memory.state_memory`, which counts a DTensor's local shard).

Usage: `python benchmarks/fsdp_memory.py [--json]` (runs torchrun itself).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BLOCKS = 8
WIDTH = 256
SAMPLES = 512
GLOBAL_BATCH = 64
STEPS = SAMPLES // GLOBAL_BATCH
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _setup() -> tuple[Any, Any, Any]:
    """The model, its AdamW optimizer and the dataset, the same in every run."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(WIDTH, WIDTH)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.linear(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(32, WIDTH)
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
            self.out = nn.Linear(WIDTH, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.inp(x)
            for block in self.blocks:
                h = block(h)
            return self.out(h)

    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(SAMPLES, 32, generator=gen), torch.randn(SAMPLES, 1, generator=gen)
    )
    return model, optimizer, data


def one_process() -> list[float]:
    """The reference: plain torch, the global batch, one process."""
    import torch
    from torch import nn

    model, optimizer, data = _setup()
    losses = []
    for x, y in torch.utils.data.DataLoader(data, batch_size=GLOBAL_BATCH):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def rank_main(strategy: str, out: Path) -> None:
    """One rank of a 2-process run (launched by torchrun): the user's loop after optimize()."""
    import torch
    import torch.distributed as dist
    from torch import nn

    import autoopt
    from autoopt.runtime.memory import state_memory

    model, optimizer, data = _setup()
    loader = torch.utils.data.DataLoader(data, batch_size=GLOBAL_BATCH // 2)
    model, loader, optimizer = autoopt.optimize(
        model, loader, optimizer, distributed=strategy, amp=False, compile=False, verbose=False
    )
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    memory = state_memory(autoopt.unwrap(model), optimizer)
    rank = dist.get_rank()
    result = {"losses": losses, "memory": memory.__dict__, "rank": rank}
    (out / f"{strategy}-rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def two_processes(strategy: str, out: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        __file__,
        "--child",
        strategy,
        str(out),
    ]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return [json.loads((out / f"{strategy}-rank{r}.json").read_text()) for r in range(2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        rank_main(args.child[0], Path(args.child[1]))
        return 0
    reference = one_process()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("ddp", "fsdp"):
            ranks = two_processes(strategy, Path(tmp))
            diff = max(
                abs(a - b) / abs(b)
                for r in ranks
                for a, b in zip(r["losses"], reference, strict=True)
            )
            for r in ranks:
                m = r["memory"]
                rows.append(
                    {
                        "strategy": strategy,
                        "rank": r["rank"],
                        "max_rel_loss_diff": diff,
                        "parameters": m["parameters"],
                        "gradients": m["gradients"],
                        "optimizer_state": m["optimizer_state"],
                    }
                )
    if args.json:
        print(json.dumps({"reference_losses": reference, "runs": rows}, indent=2))
        return 0
    print(f"one process, global batch {GLOBAL_BATCH}: final loss {reference[-1]:.6f}")
    print(
        "| strategy | rank | max rel. loss diff vs 1 process | parameters | gradients "
        "| optimizer state | params + optimizer state |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        both = row["parameters"] + row["optimizer_state"]
        print(
            f"| {row['strategy']} | {row['rank']} | {row['max_rel_loss_diff']:.2e} "
            f"| {row['parameters']:,} B | {row['gradients']:,} B "
            f"| {row['optimizer_state']:,} B | {both:,} B |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
