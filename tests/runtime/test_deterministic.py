"""deterministic=True trains bit for bit as the user's eager loop does, same seed, random numbers
included, whatever the machine or the caches would have had the measured choices decide: no
choice made by timing (layout, bf16, the optimizer's kernels) or by the compile cache's record
(compile) changes a number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import hardware
from autoopt.runtime.passes import compile as compile_pass

from .models import RANDOM_MODELS, SmallCNN, batches, cnn_data, mlp_data

MODELS = {"cnn": SmallCNN, **RANDOM_MODELS}


def fit(name: str, options: dict[str, Any] | None) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = MODELS[name]()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if options is not None:
        model, optimizer = autoopt.optimize(model, optimizer=optimizer, verbose=False, **options)
    x, y = cnn_data(64) if name == "cnn" else mlp_data(64)
    torch.manual_seed(1)
    losses = []
    for _ in range(3):
        for xb, yb in batches(x, y, 16):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    return model, [*losses, *(p.detach() for p in model.parameters()), torch.get_rng_state()]


@pytest.mark.parametrize("name", MODELS)
def test_deterministic_trains_bit_for_bit_as_eager(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where every measured choice would run: a CPU with native bf16, a compile cache.
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")
    _, eager = fit(name, None)
    model, ours = fit(name, {"deterministic": True, "compile_cache": tmp_path})
    for got, expected in zip(ours, eager, strict=True):
        assert torch.equal(got, expected), autoopt.report(model)
    report = autoopt.report(model)
    for measured in ("amp", "compile"):
        assert "deterministic=True" in report[measured].detail, report[measured].detail
