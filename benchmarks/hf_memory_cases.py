"""Issue 23's memory cases on real model code, each against the same loop in plain torch:

* `memory_budget` on tiny GPT-2, Llama and T5 (transformers, random init, no downloads) with
  `use_cache` on and off: does a plan apply, and how far is the first step's gradient from
  eager's (relative norm)?
* `accumulate="auto"` with uneven padding (labels -100): GPT-2 and Llama with HF `labels`, and a
  plain-torch LM with `cross_entropy(ignore_index=-100)`, once under a budget where batches stay
  whole and once where they are split.

Run: `.venv/bin/python benchmarks/hf_memory_cases.py` (CPU, about a minute). Each line prints the
case, what autoopt's report says, and the relative gradient difference to the plain loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import autoopt
from autoopt.runtime.memory import saved_tensor_bytes, state_memory

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
        model, loader, opt = autoopt.optimize(model, batches, opt, **OFF, **options)
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


def activations(model: nn.Module, batch: Any, loss_of: Callable[..., torch.Tensor]) -> int:
    return saved_tensor_bytes(lambda: loss_of(model, batch))


def budget_case(name: str, make: Callable[[bool], nn.Module], use_cache: bool) -> None:
    encdec = name == "t5"
    batches = padded_batches(encoder_decoder=encdec)
    want, _ = train(make(use_cache), batches, hf_loss)
    model = make(use_cache)
    opt = Recording(model.parameters())
    state = state_memory(model, opt).state
    budget = state + activations(make(use_cache), batches[0], hf_loss) // 2
    row = f"budget   {name:<6} use_cache={use_cache!s:<5}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got, trained = train(model, batches, hf_loss, memory_budget=budget)
    except Exception as err:
        print(f"{row} crashed: {type(err).__name__}: {str(err)[:90]}")
        return
    plan = autoopt.report(trained)["checkpoint"].detail
    hint = "; warned: " + str(caught[0].message)[:80] if caught else ""
    print(f"{row} rel grad diff {rel(got.grads, want.grads):.2e}  plan: {plan[:70]}{hint}")


def accumulate_case(name: str, make: Callable[[], nn.Module], split: bool) -> None:
    batches = padded_batches()
    loss_of = lm_loss if name == "torch-lm" else hf_loss
    want, _ = train(make(), batches, loss_of)
    model = make()
    opt = Recording(model.parameters())
    state = state_memory(model, opt).state
    per_batch = activations(make(), batches[0], loss_of)
    budget = state + (per_batch // 3 if split else per_batch * 4)
    row = f"accumulate {name:<8} {'split' if split else 'whole':<5}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, trained = train(
            model, batches, loss_of, accumulate="auto", checkpoint=False, memory_budget=budget
        )
    line = autoopt.report(trained)["accumulate"].detail
    hint = "; warned" if any("accumulate" in str(w.message) for w in caught) else ""
    print(f"{row} rel grad diff {rel(got.grads, want.grads):.2e}  {line[:90]}{hint}")


def main() -> None:
    for name, make in (("gpt2", gpt2), ("llama", llama), ("t5", t5)):
        for use_cache in (True, False):
            budget_case(name, make, use_cache)
    for name, make_lm in (
        ("gpt2", lambda: gpt2(False)),
        ("llama", lambda: llama(False)),
        ("torch-lm", tiny_lm),
    ):
        for split in (False, True):
            accumulate_case(name, make_lm, split)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()

