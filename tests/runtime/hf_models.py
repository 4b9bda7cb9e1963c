"""Tiny transformers models (random init, no downloads), a plain-torch LM, padded LM batches and
a loop that records each optimizer step's gradients: issue 23's real-model cases, shared by
tests/runtime/test_hf_memory.py, test_accumulate_token_mean.py and benchmarks/hf_memory_cases.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import autoopt

OFF = {"amp": False, "compile": False, "channels_last": False, "verbose": False}
VOCAB, SEQ, ROWS = 64, 12, 8


def gpt2(use_cache: bool = True) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=4, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, use_cache=use_cache,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(cfg)


def llama(use_cache: bool = True) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, use_cache=use_cache,
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def t5(use_cache: bool = True) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        d_model=32, d_ff=64, num_layers=3, num_heads=2, d_kv=16, vocab_size=VOCAB,
        decoder_start_token_id=0, dropout_rate=0.0, use_cache=use_cache,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg)


class TinyLM(nn.Module):
    """A plain-torch causal LM: the loss is computed outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3)
        )
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def tiny_lm() -> nn.Module:
    torch.manual_seed(0)
    return TinyLM()


def padded_batches(count: int = 2, encoder_decoder: bool = False) -> list[dict[str, torch.Tensor]]:
    """HF batches with uneven right padding: attention_mask 0 and labels -100 on the padding."""
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        ids = torch.randint(1, VOCAB, (ROWS, SEQ), generator=gen)
        lengths = torch.randint(2, SEQ + 1, (ROWS,), generator=gen)
        lengths[0], lengths[1] = SEQ, 3  # certainly uneven
        mask = (torch.arange(SEQ)[None] < lengths[:, None]).long()
        labels = ids.masked_fill(mask == 0, -100)
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if encoder_decoder:
            batch["decoder_attention_mask"] = mask
        batches.append(batch)
    return batches


class Recording(torch.optim.SGD):
    """SGD that keeps the gradients of each step it takes."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.05)
        self.grads: list[list[torch.Tensor]] = []

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        self.grads.append([
            p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            for g in self.param_groups for p in g["params"]
        ])  # fmt: skip
        return super().step(closure)


def hf_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    return model(**batch).loss


def lm_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    ids, labels = batch["input_ids"], batch["labels"]
    logits = model(ids)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def train(
    model: nn.Module,
    batches: list[Any],
    loss_of: Callable[[nn.Module, Any], torch.Tensor],
    **options: Any,
) -> tuple[Recording, nn.Module]:
    opt = Recording(model.parameters())
    loader: Any = batches
    if options:
        model, loader, opt = autoopt.optimize(model, batches, opt, **{**OFF, **options})
    model.train()
    for batch in loader:
        opt.zero_grad()
        loss_of(model, batch).backward()
        opt.step()
    return opt, model


def rel(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> float:
    """The largest relative gradient difference over the steps: |got - want| / |want|."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(g, w, strict=True)))
        norm = torch.sqrt(sum((b**2).sum() for b in w))
        worst = max(worst, float(diff / norm))
    return worst
