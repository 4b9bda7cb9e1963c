"""The normalisers a batch offers and the shares they give the parts of a split batch."""

from __future__ import annotations

import torch

from autoopt.runtime.accumulation.loss_shares import (
    Normaliser,
    candidates,
    fit_ratio,
    matching,
    pick_pair,
)

IDS = torch.arange(1, 13).reshape(3, 4)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
BATCH = {"input_ids": IDS, "attention_mask": MASK, "labels": IDS.masked_fill(MASK == 0, -100)}


def test_candidates_are_samples_sum_and_the_counts_of_every_integer_tensor() -> None:
    found = candidates(BATCH, 3)
    labels = [Normaliser("labels", (key,), shift) for key in BATCH for shift in (0, 1)]
    masks = [Normaliser("mask", ("attention_mask",), shift) for shift in (0, 1)]
    # Those that weigh these rows alike (input_ids counts no -100) are kept for later batches.
    assert found == [Normaliser("samples"), Normaliser("sum"), *labels, *masks]
    assert found[7].describe() == "the entries of batch['labels'][:, 1:] != -100"


def test_shares_of_the_parts() -> None:
    shifted = Normaliser("labels", ("labels",), 1)  # rows count 3, 1, 2
    assert shifted.shares(BATCH, [1, 2]) == [(3, 6), (3, 6)]
    assert Normaliser("samples").shares(BATCH, [2, 1]) == [(2, 3), (1, 3)]
    assert Normaliser("sum").shares(BATCH, [2, 1]) == [(1, 1), (1, 1)]


def test_the_pair_that_tells_most_apart_and_what_matches_it() -> None:
    cands = candidates(BATCH, 3)
    a, b = pick_pair(cands, BATCH, 3)
    assert (a, b) == (1, 2)  # 2 and 3 labelled tokens (1 and 2 shifted): the widest spread
    shifted = [Normaliser("labels", ("labels",), 1), Normaliser("mask", ("attention_mask",), 1)]
    assert matching(cands, BATCH, a, b, (1 / 3, 2 / 3)) == shifted  # the same counts here
    assert matching(cands, BATCH, a, b, (0.5, 0.5))[0] == Normaliser("samples")
    assert matching(cands, BATCH, a, b, (0.6, 0.6)) == []


def test_fit_ratio_refuses_what_is_not_a_multiple() -> None:
    alone = torch.tensor([1.0, -2.0, 3.0])
    assert fit_ratio(0.25 * alone, alone) == 0.25
    assert fit_ratio(torch.tensor([1.0, 2.0, 3.0]), alone) is None
    assert fit_ratio(alone, torch.zeros(3)) is None
