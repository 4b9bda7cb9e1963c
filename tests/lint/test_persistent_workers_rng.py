"""AO104's fix is unsafe: `persistent_workers=True` changes the batches of epoch 2 onward.

A non-persistent DataLoader draws its workers' base seed from the main process's global RNG at
every `iter(loader)`; a persistent one draws it once and resets its iterator afterwards. The
`RandomSampler` seeds each epoch's shuffle from the same global RNG, so from the second epoch on
the two loaders shuffle differently (seen on torch 2.13: epoch 1 equal, epochs 2 and 3 not).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.rule import FixSafety


def _epoch_orders(persistent: bool, epochs: int = 2) -> list[list[int]]:
    torch.manual_seed(0)
    loader = DataLoader(
        list(range(16)), batch_size=4, shuffle=True, num_workers=1, persistent_workers=persistent
    )
    return [[i for batch in loader for i in batch.tolist()] for _ in range(epochs)]


@pytest.mark.slow
def test_persistent_workers_change_the_shuffle_from_epoch_two() -> None:
    restarted, persistent = _epoch_orders(False), _epoch_orders(True)
    assert restarted[0] == persistent[0]  # the first epoch draws the same seeds
    assert restarted[1] != persistent[1]  # then one base-seed draw fewer per epoch
    rule = load_registry().rules["AO104"]
    assert rule.fix_safety is FixSafety.UNSAFE, "the fix changes the batches: it cannot be safe"
