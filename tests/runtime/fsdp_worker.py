"""One rank of the two-process FSDP2 test; launched by `torchrun --nproc_per_node=2` from
test_fsdp.py. Runs the user's UNCHANGED loop after `autoopt.optimize(distributed="fsdp")` and
writes what it saw to OUT/rank<R>.json (and rank 0's full state dicts to OUT/*.pt):

* "train": STEPS AdamW steps of a 4-block model, the global loss of each step, per-rank bytes;
* "resume": a fresh model loads the saved full state dicts and trains STEPS more steps;
* "amp": amp="bf16" under FSDP next to torch's own fully_shard + MixedPrecisionPolicy loop;
* "auto": distributed="auto" with a memory budget below / above the model's state;
* "accumulate": accumulate=2 under FSDP with SGD;
* "checkpoint": checkpoint=2 on an nn.Sequential under FSDP;
* "plan": checkpoint="auto" under a memory budget, under FSDP: the report's memory section.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset

import autoopt
from autoopt.runtime.checkpointing.checkpoint_plan import memory_plan
from autoopt.runtime.memory import state_memory

SAMPLES = 32
GLOBAL_BATCH = 8  # each of the 2 ranks gets 4 samples per step
STEPS = SAMPLES // GLOBAL_BATCH
WIDTH = 16
LR = 1e-2
ACCUMULATE = 2
OFF = {"compile": False, "channels_last": False, "checkpoint": False}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Tiny(nn.Module):
    """Four blocks in an nn.ModuleList between an input and an output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.out = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def make_model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def make_data() -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(
        torch.randn(SAMPLES, 4, generator=gen), torch.randn(SAMPLES, 1, generator=gen)
    )


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)


def _loader(world: int) -> DataLoader:
    return DataLoader(make_data(), batch_size=GLOBAL_BATCH // world, shuffle=False)


def _train(model: nn.Module, loader: Any, opt: torch.optim.Optimizer) -> list[float]:
    """The user's loop; returns each step's global loss (the mean over ranks)."""
    losses = []
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / dist.get_world_size())
    return losses


def train_phase(rank: int, out: Path) -> dict[str, Any]:
    model = make_model(seed=rank)  # rank 0's initialisation must win (broadcast)
    opt = make_optimizer(model)
    model, loader, opt = autoopt.optimize(
        model, _loader(2), opt, distributed="fsdp", amp=False, verbose=False, **OFF
    )
    losses = _train(model, loader, opt)
    memory = state_memory(model, opt)
    full = autoopt.full_state_dict(model)
    full_opt = autoopt.full_optimizer_state_dict(model, opt)
    if rank == 0:
        torch.save(full, out / "model.pt")
        torch.save(full_opt, out / "optimizer.pt")
    return {
        "losses": losses,
        "full_keys": sorted(full),
        "param_bytes": memory.parameters,
        "optimizer_bytes": memory.optimizer_state,
        "same_object": model is autoopt.unwrap(model),
        "report": autoopt.report(model).to_dict(),
        "loader_len": len(loader),
    }


def resume_phase(rank: int, out: Path) -> dict[str, Any]:
    model = make_model(seed=50 + rank)
    opt = make_optimizer(model)
    model, loader, opt = autoopt.optimize(
        model, _loader(2), opt, distributed="fsdp", amp=False, verbose=False, **OFF
    )
    saved = torch.load(out / "model.pt") if rank == 0 else {}
    saved_opt = torch.load(out / "optimizer.pt") if rank == 0 else {}
    autoopt.load_full_state_dict(model, saved)  # rank 1 passes {}: rank 0's is broadcast
    autoopt.load_full_optimizer_state_dict(model, opt, saved_opt)
    losses = _train(model, loader, opt)
    full = autoopt.full_state_dict(model)
    if rank == 0:
        torch.save(full, out / "resumed.pt")
    return {"losses": losses}


def amp_phase(rank: int) -> dict[str, Any]:
    """autoopt's bf16 under FSDP against torch's own FSDP2 + MixedPrecisionPolicy loop."""
    model = make_model()
    opt = make_optimizer(model)
    # compile and channels_last asked for: they must stand down under FSDP (else no equality).
    model, loader, opt = autoopt.optimize(
        model,
        _loader(2),
        opt,
        distributed="fsdp",
        amp="bf16",
        compile=True,
        channels_last=True,
        checkpoint=False,
        verbose=False,
    )
    ours = _train(model, loader, opt)
    ours_state = autoopt.full_state_dict(model)

    ref = make_model()
    mesh = dist.device_mesh.init_device_mesh("cpu", (2,))
    for block in ref.blocks:
        fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32))
    fully_shard(
        ref,
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(torch.bfloat16, torch.float32, torch.float32),
    )
    ref_opt = make_optimizer(ref)
    ref_loader = DataLoader(
        make_data(),
        batch_size=GLOBAL_BATCH // 2,
        sampler=torch.utils.data.DistributedSampler(make_data(), shuffle=False),
    )
    theirs = _train(ref, ref_loader, ref_opt)
    ref_state = autoopt.full_state_dict(ref)
    diff = max(((ours_state[k] - ref_state[k]).abs().max().item() for k in ref_state), default=0.0)
    return {
        "ours": ours,
        "theirs": theirs,
        "max_state_diff": diff,
        "report": autoopt.report(model).to_dict(),
    }


def accumulate_phase() -> dict[str, Any]:
    """accumulate=ACCUMULATE under FSDP with SGD: one step per ACCUMULATE batches. SGD and no
    clipping, so that a gradient N times too large would show."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, loader, opt = autoopt.optimize(
        model,
        _loader(2),
        opt,
        distributed="fsdp",
        amp=False,
        accumulate=ACCUMULATE,
        verbose=False,
        **OFF,
    )
    for x, y in loader:  # the user's loop, unchanged
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {
        "state": {k: v.tolist() for k, v in autoopt.full_state_dict(model).items()},
        "report": autoopt.report(model).to_dict(),
    }


def checkpoint_phase() -> dict[str, Any]:
    """checkpoint=2 (checkpoint_sequential) over an 8-layer nn.Sequential, under FSDP."""
    model = make_deep()
    opt = make_optimizer(model)
    model, loader, opt = autoopt.optimize(
        model, _loader(2), opt, distributed="fsdp", checkpoint=2, amp=False, verbose=False
    )
    _train(model, loader, opt)
    return {
        "state": {k: v.tolist() for k, v in autoopt.full_state_dict(model).items()},
        "report": autoopt.report(model).to_dict(),
    }


def plan_phase() -> dict[str, Any]:
    """checkpoint="auto" with a budget no plan meets (every block checkpointed) under FSDP."""
    model = make_model()
    opt = make_optimizer(model)
    model, loader, opt = autoopt.optimize(
        model,
        _loader(2),
        opt,
        distributed="fsdp",
        checkpoint="auto",
        memory_budget=1,
        amp=False,
        verbose=False,
    )
    _train(model, loader, opt)
    planned = memory_plan(model)
    assert planned is not None
    memory = autoopt.report(model).memory
    assert memory is not None
    return {
        "state": {k: v.tolist() for k, v in autoopt.full_state_dict(model).items()},
        "report": autoopt.report(model).to_dict(),
        "memory": memory.to_dict(),
        "planned_parameters": planned.after.parameters,
        "param_bytes": state_memory(model, opt).parameters,
        "full_param_bytes": state_memory(make_model(), None).parameters,
    }


def make_deep() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, WIDTH), *[nn.Linear(WIDTH, WIDTH) for _ in range(6)], nn.Linear(WIDTH, 1)
    )


def auto_phase() -> dict[str, Any]:
    chosen = {}
    budget_of_state = state_memory(make_model(), make_optimizer(make_model())).state
    for name, budget in (("below", budget_of_state - 1), ("above", budget_of_state * 10)):
        model = make_model()
        opt = make_optimizer(model)
        model, opt = autoopt.optimize(
            model, optimizer=opt, memory_budget=budget, amp=False, verbose=False, **OFF
        )
        chosen[name] = {
            "type": type(model).__name__,
            "detail": autoopt.report(model)["distributed"].detail,
        }
    return chosen


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    result = {"rank": rank, "train": train_phase(rank, out)}
    dist.barrier()  # model.pt is written
    result["resume"] = resume_phase(rank, out)
    result["amp"] = amp_phase(rank)
    result["auto"] = auto_phase()
    result["accumulate"] = accumulate_phase()
    result["checkpoint"] = checkpoint_phase()
    result["plan"] = plan_phase()
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
