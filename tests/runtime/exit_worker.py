"""A user's torchrun script under optimize(), ended as users end theirs: no
destroy_process_group(), no os._exit, the models still alive as globals. Launched by
`torchrun --nproc_per_node=2` from test_distributed_exit.py.

An exit hook registered before optimize() runs after autoopt's own (atexit runs handlers last
in, first out) and writes `rank<N>.json`: the gloo threads still alive at that point, read from
/proc (pt_gloo_runloop, gloo_tcp_loop), which autoopt's hook must have joined."""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

import autoopt

OUT = Path(sys.argv[1])
RANK = int(os.environ["RANK"])


def gloo_threads() -> list[str]:
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # a thread that ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


def at_exit() -> None:
    (OUT / f"rank{RANK}.json").write_text(
        json.dumps({"rank": RANK, "trained": TRAINED, "gloo_threads_at_exit": gloo_threads()})
    )


atexit.register(at_exit)  # before optimize(): runs after autoopt's hook
TRAINED: dict[str, list[str]] = {}


def train(strategy: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = autoopt.optimize(model, None, opt, distributed=strategy, verbose=False)
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    TRAINED[strategy] = gloo_threads()
    return model, opt


# Globals, as in a script: alive until interpreter teardown.
ddp_model, ddp_opt = train("ddp")
fsdp_model, fsdp_opt = train("fsdp")
