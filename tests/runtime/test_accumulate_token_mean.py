"""accumulate="auto" with the losses LMs are trained with: a token mean over labels padded with
-100 (HF `labels`, `cross_entropy(..., ignore_index=-100)`), rows of uneven length. The first
batch is not perturbed when batches stay whole; split batches rebuild the full batch's
gradient (parts weighted by their labelled tokens); a loss no weighting rebuilds stands down.
Each compared with the same loop in plain torch on whole batches (issue 23)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import autoopt
from autoopt.runtime.memory import saved_tensor_bytes, state_memory
from autoopt.runtime.report import Status
from tests.runtime.hf_models import (
    VOCAB,
    Recording,
    gpt2,
    hf_loss,
    llama,
    lm_loss,
    padded_batches,
    rel,
    tiny_lm,
    train,
)

pytest.importorskip("transformers")


def _auto(
    make: Callable[[], nn.Module], loss_of: Callable[..., torch.Tensor], split: bool
) -> tuple[Recording, Recording, nn.Module]:
    """The plain loop's and autoopt's gradients per step, under a budget where batches of 8
    stay whole or go in parts of 2."""
    batches = padded_batches()
    want, _ = train(make(), batches, loss_of)
    model = make()
    state = state_memory(model, Recording(model.parameters())).state
    per_batch = saved_tensor_bytes(lambda: loss_of(make(), batches[0]))
    budget = state + (per_batch // 3 if split else per_batch * 4)
    got, model = train(
        model, batches, loss_of, accumulate="auto", checkpoint=False, memory_budget=budget
    )
    return want, got, model


def _split_counting(
    batches: list[dict[str, torch.Tensor]], sized_on: int = 0
) -> tuple[Recording, Recording, nn.Module, list[int]]:
    """The plain loop's and autoopt's gradients per step, under a budget where batch `sized_on`
    goes in parts of 2 (a third of its activations), and the rows of every forward autoopt ran."""
    want, _ = train(tiny_lm(), batches, lm_loss)
    model = tiny_lm()
    state = state_memory(model, Recording(model.parameters())).state
    budget = state + saved_tensor_bytes(lambda: lm_loss(tiny_lm(), batches[sized_on])) // 3
    rows: list[int] = []

    def counting_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        rows.append(len(batch["labels"]))
        return lm_loss(model, batch)

    got, model = train(
        model, batches, counting_loss, accumulate="auto", checkpoint=False, memory_budget=budget
    )
    return want, got, model, rows


def test_whole_batches_leave_the_first_batch_unperturbed() -> None:
    """The probe trains with its gradients zeroed and undone: the first step is the eager one,
    bit for bit (before: the first batch ran as a probe plus the rest, off by 0.03)."""
    want, got, model = _auto(tiny_lm, lm_loss, split=False)
    assert "batches stay whole" in autoopt.report(model)["accumulate"].detail
    assert rel(got.grads, want.grads) == 0.0


@pytest.mark.parametrize(
    ("make", "loss_of"),
    [(tiny_lm, lm_loss), (lambda: gpt2(False), hf_loss), (lambda: llama(False), hf_loss)],
    ids=["torch-lm", "gpt2", "llama"],
)
def test_split_batches_weight_parts_by_their_labelled_tokens(
    make: Callable[[], nn.Module], loss_of: Callable[..., torch.Tensor]
) -> None:
    """Causal LMs shift the labels by one (HF inside the model, the plain LM in its loss): the
    normaliser is the entries of labels[:, 1:] != -100 (before: off by 0.5 by sample shares)."""
    want, got, model = _auto(make, loss_of, split=True)
    result = autoopt.report(model)["accumulate"]
    assert result.status is Status.APPLIED
    assert "4 micro-batches of <= 2 samples" in result.detail
    assert "its share of the entries of batch['labels'][:, 1:] != -100" in result.detail
    assert rel(got.grads, want.grads) < 1e-5


def _per_sample_mean_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Each row's token mean, then the mean over rows: the normaliser is the samples."""
    labels = batch["labels"][:, 1:]
    ce = F.cross_entropy(
        model(batch["input_ids"])[:, :-1].transpose(1, 2),
        labels,
        ignore_index=-100,
        reduction="none",
    )
    return (ce.sum(1) / (labels != -100).sum(1)).mean()


def test_a_per_sample_mean_weights_parts_by_their_samples() -> None:
    want, got, model = _auto(tiny_lm, _per_sample_mean_loss, split=True)
    assert "its share of the samples, the normaliser" in autoopt.report(model)["accumulate"].detail
    assert rel(got.grads, want.grads) < 1e-5


def _max_token_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """A loss normalised by the batch's longest row: no count of a part rebuilds it."""
    labels = batch["labels"][:, 1:]
    ce = F.cross_entropy(
        model(batch["input_ids"])[:, :-1].reshape(-1, VOCAB),
        labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return ce / (labels != -100).sum(1).max() / len(labels)


def test_a_loss_no_weighting_rebuilds_stands_down_with_a_warning() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        want, got, model = _auto(tiny_lm, _max_token_loss, split=True)
    assert any("stands down" in str(w.message) for w in caught)
    result = autoopt.report(model)["accumulate"]
    assert result.status is Status.SKIPPED
    assert "no weighting of the parts rebuilds its gradient" in result.detail
    assert rel(got.grads, want.grads) == 0.0  # batches whole, the probe undone


def test_memory_before_is_the_users_batch_not_a_micro_batch() -> None:
    _, _, model = _auto(tiny_lm, lm_loss, split=True)
    memory = autoopt.report(model).memory
    assert memory is not None
    batch = padded_batches()[0]
    # What the whole batch's forward saves in eager (fit on 1 and 2 rows; the loss outside the
    # forward is not counted), not a micro-batch's (before: 2 rows of 8).
    eager = saved_tensor_bytes(lambda: tiny_lm()(batch["input_ids"]))
    assert memory.before.activations == eager
    assert memory.after.activations < eager / 3


def test_under_bf16_the_normaliser_is_measured_inside_the_model() -> None:
    """Under autocast HF computes the loss from bf16 logits inside the model; the logits it
    returns are cast copies no gradient reaches, so the probes read the gradients at its modules'
    outputs. Compared with the same loop under torch.autocast (bf16 rounding: the fp32 loop is
    4e-3 away from it)."""

    def autocast_loss(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return hf_loss(model, batch)

    batches = padded_batches()
    want, _ = train(gpt2(), batches, autocast_loss)
    model = gpt2()
    state = state_memory(model, Recording(model.parameters())).state
    budget = state + saved_tensor_bytes(lambda: hf_loss(gpt2(), batches[0])) // 3
    opts = {"amp": "bf16", "accumulate": "auto", "checkpoint": False, "memory_budget": budget}
    got, model = train(model, batches, hf_loss, **opts)
    detail = autoopt.report(model)["accumulate"].detail
    assert "its share of the entries of batch['labels'][:, 1:] != -100" in detail
    assert rel(got.grads, want.grads) < 1e-2


def test_a_part_whose_labels_are_all_ignored_is_left_out() -> None:
    """Its own loss would be 0/0 (NaN in every gradient); the full batch leaves its rows out."""
    batches = padded_batches()
    for batch in batches:
        batch["labels"][6:] = -100  # the last part of 2 rows: all padding, nothing to learn
        batch["attention_mask"][6:] = 0
    want, got, _, rows = _split_counting(batches)
    assert rows == [2, 1, 1] + [2, 2, 2] * 2  # probes, then 3 of the 4 parts of each batch
    assert rel(got.grads, want.grads) < 1e-5


def test_padding_that_only_a_later_batch_has_is_probed_there() -> None:
    """A first batch without padding cannot tell samples from labelled tokens (they weigh its
    rows alike); the first padded batch is probed again before it is split."""
    batches = padded_batches()
    batches[0]["labels"] = batches[0]["input_ids"].clone()
    batches[0]["attention_mask"] = torch.ones_like(batches[0]["input_ids"])
    want, got, model, rows = _split_counting(batches)
    assert rows == ([2, 1, 1] + [2] * 4) * 2  # probes on each batch, then its 4 parts
    assert "batch['labels'][:, 1:] != -100" in autoopt.report(model)["accumulate"].detail
    assert rel(got.grads, want.grads) < 1e-5


def test_a_first_batch_that_fits_then_larger_ones_in_parts_are_probed_first() -> None:
    """The first batch (2 samples) fits whole, so its probe measured no normaliser; the larger
    batches after it go in parts and are probed first, so the parts are weighted by their
    labelled tokens (before: split by samples unprobed, 6e-3 off the plain loop, no warning)."""
    small = {k: v[:2] for k, v in padded_batches(1)[0].items()}
    batches = [small, *padded_batches(2)]
    want, got, model, _ = _split_counting(batches, sized_on=1)  # 2 samples fit, 8 do not
    detail = autoopt.report(model)["accumulate"].detail
    assert "the first larger one is probed" in detail
    assert "its share of the entries of batch['labels'][:, 1:] != -100" in detail
    assert rel(got.grads, want.grads) < 1e-5
