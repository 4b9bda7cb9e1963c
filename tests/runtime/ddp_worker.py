"""One rank of the two-process DDP test; launched by `torchrun --nproc_per_node=2` from
test_distributed.py. Runs the user's UNCHANGED loop after `autoopt.optimize` and writes what it
saw to OUT/rank<R>.json:

* phase "plain": shuffle=True loader, 2 epochs, one optimizer step per batch;
* phase "accumulate": shuffle=False loader, accumulate=2, a DDP comm hook counting all-reduces.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autoopt

SAMPLES = 32
BATCH = 4
OFF = {"amp": False, "compile": False, "channels_last": False, "checkpoint": False}


def make_data() -> TensorDataset:
    """The same dataset on every rank (and in the test that checks the result): x, y, index."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(SAMPLES, 4, generator=gen)
    y = torch.randn(SAMPLES, 1, generator=gen)
    return TensorDataset(x, y, torch.arange(SAMPLES))


def make_model(rank: int) -> nn.Module:
    # A different initialisation per rank on purpose: DDP must broadcast rank 0's parameters.
    torch.manual_seed(100 + rank)
    return nn.Linear(4, 1)


def _params(model: nn.Module) -> dict[str, Any]:
    return {k: v.tolist() for k, v in model.state_dict().items()}


def plain_phase(rank: int) -> dict[str, Any]:
    model = make_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=True)
    model, loader, opt = autoopt.optimize(model, loader, opt, verbose=False, **OFF)
    initial = _params(model)
    seen = []
    for _epoch in range(2):
        order = []
        for x, y, idx in loader:  # the user's loop, unchanged
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            order.extend(idx.tolist())
        seen.append(order)
    return {
        "initial": initial,
        "final": _params(model),
        "seen": seen,
        "keys": list(model.state_dict().keys()),
        "model_type": type(model).__name__,
        "is_ddp": isinstance(model, nn.parallel.DistributedDataParallel),
        "unwrapped_keys": list(autoopt.unwrap(model).state_dict().keys()),
        "in_features": model.in_features,  # attribute of the inner module, through the wrapper
        "report": autoopt.report(model).to_dict(),
    }


def accumulate_phase(rank: int) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = make_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(make_data(), batch_size=BATCH, shuffle=False)
    model, loader, opt = autoopt.optimize(model, loader, opt, accumulate=2, verbose=False, **OFF)
    syncs = {"count": 0}

    # No annotations: DDP rejects a `bucket` annotation other than the GradBucket class itself.
    def counting_hook(state, bucket):
        state["count"] += 1
        return allreduce_hook(None, bucket)

    model.register_comm_hook(syncs, counting_hook)
    initial = _params(model)
    order = []
    for x, y, idx in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        order.extend(idx.tolist())
    return {"initial": initial, "final": _params(model), "seen": order, "syncs": syncs["count"]}


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    result = {"rank": rank, "plain": plain_phase(rank), "accumulate": accumulate_phase(rank)}
    result["world_size"] = torch.distributed.get_world_size()
    torch.distributed.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
