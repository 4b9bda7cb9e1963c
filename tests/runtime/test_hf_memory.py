"""memory_budget on transformers decoders (GPT-2, Llama, T5; tiny random configs) with the
default use_cache=True and without it: the plan applies, and training gives the gradients of
the same loop in eager and of transformers' own gradient checkpointing (issue 23)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from autoopt.runtime.report import Status
from tests.runtime.hf_models import Recording, gpt2, hf_loss, llama, padded_batches, rel, t5, train

pytest.importorskip("transformers")


def _budget(make: Callable[[bool], nn.Module], use_cache: bool, batch: dict) -> int:
    """State + half of what the eager step saves: some blocks must be checkpointed."""
    model = make(use_cache)
    state = state_memory(model, Recording(model.parameters())).state
    return state + saved_tensor_bytes(lambda: hf_loss(model, batch)) // 2


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("make", [gpt2, llama, t5], ids=["gpt2", "llama", "t5"])
def test_budget_plans_and_trains_as_eager_and_hf_checkpointing(
    make: Callable[[bool], nn.Module], use_cache: bool
) -> None:
    batches = padded_batches(encoder_decoder=make is t5)
    eager, _ = train(make(use_cache), batches, hf_loss)
    hf_model = make(use_cache)
    hf_model.activation_checkpointing_enable()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own "use_cache=False" notice
        hf_checkpointed, _ = train(hf_model, batches, hf_loss)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not measure the blocks"
        got, model = train(
            make(use_cache), batches, hf_loss, memory_budget=_budget(make, use_cache, batches[0])
        )
    result = autoopt.report(model)["checkpoint"]
    assert result.status is Status.APPLIED, result.detail
    assert ("without the KV cache" in result.detail) is use_cache
    assert rel(got.grads, eager.grads) < 1e-5
    assert rel(got.grads, hf_checkpointed.grads) < 1e-5


def test_a_filled_user_cache_keeps_its_blocks_plain_and_exact() -> None:
    """A cache the user passes already holding states (a prefix): leaving it out of a
    checkpointed block would change its output, so no block is checkpointed."""
    from transformers import DynamicCache

    batch = padded_batches()[0]
    batch = {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}
    prefix = torch.randint(1, 64, (batch["input_ids"].shape[0], 4))

    def with_prefix(model: nn.Module, b: dict) -> torch.Tensor:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(prefix, past_key_values=cache, use_cache=True)
        return model(**b, past_key_values=cache, use_cache=True).loss

    eager, _ = train(gpt2(), [batch], with_prefix)
    budget = _budget(gpt2, True, batch)
    got, model = train(gpt2(), [batch], with_prefix, memory_budget=budget)
    assert autoopt.report(model)["checkpoint"].detail.startswith("no block:")
    assert rel(got.grads, eager.grads) < 1e-5


def test_explain_memory_takes_a_dict_batch_as_keyword_arguments() -> None:
    """transformers models take `model(**batch)`: explain_memory plans on it as training does."""
    batch = padded_batches()[0]
    budget = _budget(gpt2, True, batch)
    explained = autoopt.explain_memory(gpt2(), batch, memory_budget=budget, amp=False)
    assert [b.name for b in explained.blocks] == [f"transformer.h.{i}" for i in range(4)]
    assert any(b.mode.value != "plain" for b in explained.blocks)
    assert explained.memory.after.total <= budget < explained.memory.before.total
    eager = saved_tensor_bytes(lambda: gpt2()(**batch).loss)
    # The forward's saved bytes, the labels' loss inside it included (the data counted apart).
    assert explained.memory.before.activations == pytest.approx(eager, rel=0.1)


def test_checkpointing_and_micro_batches_together_on_a_default_gpt2() -> None:
    """use_cache=True (the default), a budget that needs checkpointing and micro-batches: both
    apply, the gradients are the full batch's, the memory section's before is the whole batch."""
    batches = padded_batches()
    eager, _ = train(gpt2(), batches, hf_loss)
    model = gpt2()
    state = state_memory(model, Recording(model.parameters())).state
    whole = saved_tensor_bytes(lambda: hf_loss(gpt2(), batches[0]))
    got, model = train(
        model, batches, hf_loss, accumulate="auto", memory_budget=state + whole // 25
    )
    report = autoopt.report(model)
    assert report["checkpoint"].status is Status.APPLIED
    assert "micro-batches of <= 4 samples per batch of 8" in report["accumulate"].detail
    assert rel(got.grads, eager.grads) < 1e-5
    assert report.memory is not None
    assert report.memory.before.activations == pytest.approx(whole, rel=0.1)


def test_a_checkpointed_block_given_a_filled_cache_runs_plainly_with_a_warning() -> None:
    """Made checkpointed on an empty cache, later given one that holds a prefix at its layer:
    that step it runs plainly (leaving the cache out would change its output)."""
    from transformers import DynamicCache

    from autoopt.runtime.checkpointing.block_checkpoint import Mode, run_block

    model = gpt2()
    block = model.transformer.h[0]
    x = torch.randn(2, 5, 32, requires_grad=True)
    cache = DynamicCache(config=model.config)
    cache.update(torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16), 0)
    want = block(x, copy.deepcopy(cache), use_cache=True)
    with pytest.warns(UserWarning, match="already holds states at its layer"):
        got = run_block(block.forward, block, Mode.FULL, (x, cache), {"use_cache": True})
    torch.testing.assert_close(got, want)
    assert cache.get_seq_length(0) == 8  # written once, as the plain block does
