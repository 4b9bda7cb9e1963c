"""One rank of the two-process `accumulate="auto"` test; launched by `torchrun --nproc_per_node=2`
from test_accumulate_auto.py. Runs the user's UNCHANGED loop under a budget that allows parts of
4 rows of the rank's batches of 8, with a DDP comm hook counting all-reduces, and writes what it
saw to OUT/rank<R>.json."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import autoopt
from autoopt.runtime.memory import saved_tensor_bytes, state_memory

SAMPLES, BATCH, PART = 64, 8, 4  # per rank: 4 batches of 8, each step covers 2 x 8 samples
# The probes (2 rows, then each alone), the first batch in 2 parts of 4; later batches the same.
EXPECTED_ROWS = [2, 1, 1] + [4, 4] * 4


def make_data() -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(
        torch.randn(SAMPLES, 6, generator=gen), torch.randn(SAMPLES, 1, generator=gen)
    )


def make_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def budget(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parts of PART rows fit, PART + 1 do not (rows as views of one batch, as the loader's)."""
    batch = make_data().tensors[0][:BATCH].clone()
    saved = [saved_tensor_bytes(lambda n=n: model(batch[:n])) for n in (PART, PART + 1)]
    return state_memory(model, optimizer).state + sum(saved) // 2


def main(out: Path) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rank = int(os.environ["RANK"])
    model = make_model()
    opt = make_optimizer(model)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=False)
    model, loader, opt = autoopt.optimize(
        model,
        loader,
        opt,
        accumulate="auto",
        memory_budget=budget(model, opt),
        amp=False,
        compile=False,
        channels_last=False,
        verbose=False,
    )
    syncs = {"count": 0}

    # No annotations: DDP rejects a `bucket` annotation other than the GradBucket class itself.
    def counting_hook(state, bucket):
        state["count"] += 1
        return allreduce_hook(None, bucket)

    model.register_comm_hook(syncs, counting_hook)
    rows = []
    for x, y in loader:  # the user's loop, unchanged
        rows.append(len(x))
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    result: dict[str, Any] = {
        "rows": rows,
        "syncs": syncs["count"],
        "final": {k: v.tolist() for k, v in model.state_dict().items()},
        "report": autoopt.report(model)["accumulate"].detail,
    }
    torch.distributed.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
