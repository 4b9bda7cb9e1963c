"""One rank of the two-process test on real model code (test_dist_hf.py), launched by
`torchrun --nproc_per_node=2`: a tiny GPT-2 from transformers (random init, no download) under
autoopt's DDP and FSDP2, each next to the same loop written with torch's own DDP / fully_shard;
full state dicts saved on rank 0 and resumed there into a plain model and optimizer; a BatchNorm
CNN under FSDP2 with bf16. Writes OUT/rank<R>.json.
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

import autoopt

SAMPLES, SEQ, VOCAB = 32, 8, 64
GLOBAL_BATCH = 8  # 4 samples per rank and step
STEPS = SAMPLES // GLOBAL_BATCH
OFF = {"amp": False, "compile": False, "channels_last": False, "checkpoint": False}
TORCH_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def make_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    """Two blocks, tied input/output embeddings, no dropout (so layouts compare exactly)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config)


def make_tokens() -> TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=gen))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def train_lm(model: nn.Module, loader: Any, opt: torch.optim.Optimizer) -> list[float]:
    """The user's loop; each step's global loss (mean over ranks: equal token counts)."""
    losses = []
    for (ids,) in loader:
        opt.zero_grad()
        loss = lm_loss(model, ids)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


def by_hand_loader(dataset: TensorDataset) -> DataLoader:
    sampler = DistributedSampler(dataset, shuffle=False)
    return DataLoader(dataset, batch_size=GLOBAL_BATCH // 2, sampler=sampler)


def comparable(name: str, value: torch.Tensor) -> torch.Tensor:
    """`value` without the key bias of GPT-2's attention (the middle third of c_attn.bias):
    softmax ignores it, so its gradient is rounding noise that AdamW scales up to lr-sized
    steps, different in every layout. Everything else must agree closely."""
    if name.endswith("attn.c_attn.bias"):
        n = value.shape[0] // 3
        return torch.cat([value[:n], value[2 * n :]])
    return value


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    return max((comparable(k, a[k]) - comparable(k, b[k])).abs().max().item() for k in a)


def resume_plain(saved: dict[str, Any], saved_opt: dict[str, Any]) -> dict[str, Any]:
    """Rank 0 alone: a plain GPT-2 and AdamW (no autoopt, no DDP) load the full state dicts and
    train STEPS more steps on the global batch, as one process would."""
    model = make_gpt2(seed=123)
    opt = make_optimizer(model)
    autoopt.load_full_state_dict(model, saved)  # plain model: a local load, no collective
    autoopt.load_full_optimizer_state_dict(model, opt, saved_opt)
    losses = []
    for (ids,) in DataLoader(make_tokens(), batch_size=GLOBAL_BATCH):
        opt.zero_grad()
        loss = lm_loss(model, ids)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.tolist() for k, v in model.state_dict().items()}}


def lm_phase(rank: int, strategy: str) -> dict[str, Any]:
    """autoopt's `distributed=strategy` on GPT-2 against torch's own DDP / FSDP2 loop."""
    model = make_gpt2(seed=rank)  # rank 0's initialisation must win
    opt = make_optimizer(model)
    loader = DataLoader(make_tokens(), batch_size=GLOBAL_BATCH // 2, shuffle=False)
    model, loader, opt = autoopt.optimize(
        model, loader, opt, distributed=strategy, verbose=False, **OFF
    )
    ours = train_lm(model, loader, opt)
    full = autoopt.full_state_dict(model)
    full_opt = autoopt.full_optimizer_state_dict(model, opt)
    report = autoopt.report(model).to_dict()

    ref = make_gpt2(seed=0)
    if strategy == "ddp":
        ref_model: nn.Module = DistributedDataParallel(ref)
    else:
        for block in ref.transformer.h:
            fully_shard(block)
        ref_model = fully_shard(ref)
    ref_opt = make_optimizer(ref_model)
    theirs = train_lm(ref_model, by_hand_loader(make_tokens()), ref_opt)
    ref_state = get_model_state_dict(ref, options=TORCH_FULL)
    result: dict[str, Any] = {"ours": ours, "theirs": theirs, "report": report}
    if rank == 0:
        result["state_diff"] = max_diff(full, ref_state)
        result["keys"] = sorted(full)
        result["resumed"] = resume_plain(full, full_opt)
    else:
        result["keys"] = sorted(full)  # {} on the other ranks
    # torch's Reducer must not be the last holder of the process group at teardown (see
    # AutooptDDP.__del__): the by-hand DDP goes here, while the group is alive.
    del ref_model
    return result


class Stage(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class BNNet(nn.Module):
    """Two conv + BatchNorm stages (the shard blocks) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = nn.ModuleList([Stage(3, 8), Stage(8, 8)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return self.head(x.mean(dim=(2, 3)))


def make_cnn(seed: int = 0) -> BNNet:
    torch.manual_seed(seed)
    return BNNet()


def make_images() -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    return TensorDataset(
        torch.randn(SAMPLES, 3, 8, 8, generator=gen), torch.randint(0, 4, (SAMPLES,), generator=gen)
    )


def train_cnn(model: nn.Module, loader: Any, opt: torch.optim.Optimizer) -> list[float]:
    losses = []
    for x, y in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def bn_phase() -> dict[str, Any]:
    """amp="bf16" under FSDP2 on a BatchNorm CNN against torch's fully_shard with the same
    policies by hand: bf16 units, BatchNorm layers as fp32 units of their own."""
    model = make_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(make_images(), batch_size=GLOBAL_BATCH // 2, shuffle=False)
    model, loader, opt = autoopt.optimize(
        model,
        loader,
        opt,
        distributed="fsdp",
        amp="bf16",
        compile=False,
        channels_last=False,
        checkpoint=False,
        verbose=False,
    )
    ours = train_cnn(model, loader, opt)
    ours_state = autoopt.full_state_dict(model)

    ref = make_cnn()
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for stage in ref.stages:
        fully_shard(stage.bn)  # no mixed precision: fp32 weights and statistics
        fully_shard(stage, mp_policy=bf16)
    root = MixedPrecisionPolicy(torch.bfloat16, torch.float32, output_dtype=torch.float32)
    fully_shard(ref, mp_policy=root)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    theirs = train_cnn(ref, by_hand_loader(make_images()), ref_opt)
    ref_state = get_model_state_dict(ref, options=TORCH_FULL)
    result = {"ours": ours, "theirs": theirs, "report": autoopt.report(model).to_dict()}
    if ours_state:  # rank 0
        result["state_diff"] = max_diff(ours_state, ref_state)
        result["running_var"] = ours_state["stages.0.bn.running_var"].tolist()
        result["bn_dtype"] = str(ours_state["stages.0.bn.weight"].dtype)
    return result


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    result = {
        "ddp": lm_phase(rank, "ddp"),
        "fsdp": lm_phase(rank, "fsdp"),
        "bn": bn_phase(),
    }
    dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
