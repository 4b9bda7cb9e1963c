"""Issue 23's memory cases on real model code, each against the same loop in plain torch:

* `memory_budget` on tiny GPT-2, Llama and T5 (transformers, random init, no downloads) with
  `use_cache` on and off: does a plan apply, and how far are the gradients from eager's?
* `accumulate="auto"` with uneven padding (labels -100): GPT-2, Llama and T5 with HF `labels`,
  and a plain-torch LM with `cross_entropy(ignore_index=-100)`, once under a budget where batches
  stay whole and once where they are split.
* Both together on the default configs (use_cache=True).

Gradient differences are relative norms |g - g_eager| / |g_eager|, the worst optimizer step.
Results: docs/benchmarks/hf-memory.md.

Run: `.venv/bin/python -m benchmarks.hf_memory_cases` (CPU, about a minute). Each line prints the
case, what autoopt's report says, and the relative gradient difference to the plain loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import autoopt
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from tests.runtime.hf_models import (
    Recording,
    gpt2,
    hf_loss,
    llama,
    lm_loss,
    padded_batches,
    rel,
    t5,
    tiny_lm,
    train,
)


def activations(model: nn.Module, batch: Any, loss_of: Callable[..., torch.Tensor]) -> int:
    """What one eager step on `batch` saves for backward."""
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
    batches = padded_batches(encoder_decoder=name == "t5")
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
    if "share of " in line:  # which normaliser the parts are weighted by
        line = line[:40] + " ... weighted by " + line.split("share of ")[1].split(",")[0]
    print(f"{row} rel grad diff {rel(got.grads, want.grads):.2e}  {line[:150]}{hint}")


def combined_case(name: str, make: Callable[[], nn.Module]) -> None:
    """Default config (use_cache=True), checkpoint="auto" and accumulate="auto" under a budget
    that needs both."""
    batches = padded_batches(encoder_decoder=name == "t5")
    want, _ = train(make(), batches, hf_loss)
    model = make()
    state = state_memory(model, Recording(model.parameters())).state
    budget = state + activations(make(), batches[0], hf_loss) // 25
    got, trained = train(model, batches, hf_loss, accumulate="auto", memory_budget=budget)
    report = autoopt.report(trained)
    parts = report["accumulate"].detail.split(" (")[0]
    print(
        f"both     {name:<6} rel grad diff {rel(got.grads, want.grads):.2e}  "
        f"checkpoint {report['checkpoint'].status.value}, {parts}"
    )


def main() -> None:
    for name, make in (("gpt2", gpt2), ("llama", llama), ("t5", t5)):
        for use_cache in (True, False):
            budget_case(name, make, use_cache)
    for name, make_lm in (
        ("gpt2", gpt2),
        ("llama", llama),
        ("t5", t5),
        ("torch-lm", tiny_lm),
    ):
        for split in (False, True):
            accumulate_case(name, make_lm, split)
    for name, make in (("gpt2", gpt2), ("llama", llama), ("t5", t5)):
        combined_case(name, make)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
