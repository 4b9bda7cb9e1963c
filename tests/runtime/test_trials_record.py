"""A trial is paid once: the winners measured on one run are recorded in the compile cache
directory and a later run of the same model takes them at its first step, without timing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.passes import channels_last as cl_pass
from autoopt.runtime.trials import choices

from .models import SmallCNN, cnn_data

# amp="auto" in fp32 (`fp32_auto`): amp=False keeps eager's kernels, no layout is measured.
pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="the trials run on CPU"),
    pytest.mark.usefixtures("fp32_auto"),
]


class LayoutClock:
    """Each read advances by the cost of the first conv weight's layout."""

    def __init__(self, model: nn.Module, channels_last: float, contiguous: float) -> None:
        self.weight = model.features[0].weight
        self.costs = {True: contiguous, False: channels_last}
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.costs[self.weight.is_contiguous()]
        return self.now


def fit(cache: Path | bool, monkeypatch: pytest.MonkeyPatch, steps: int = 10) -> nn.Module:
    torch.manual_seed(0)
    model = SmallCNN()
    monkeypatch.setattr(cl_pass, "CLOCK", LayoutClock(model, 2.0, 1.0))  # NHWC 2x slower
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=False, compile_cache=cache, verbose=False
    )
    x, y = cnn_data(8 * steps)
    for i in range(0, 8 * steps, 8):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 8]), y[i : i + 8]).backward()
        optimizer.step()
    return model


def test_a_later_run_takes_the_recorded_winners_without_timing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fit(tmp_path, monkeypatch)
    measured = choices.of_model(first)
    assert (
        measured is not None
        and measured.log
        and measured.winners["channels_last"] == ("contiguous")
    )
    assert list(tmp_path.glob("*.trials.json"))
    later = fit(tmp_path, monkeypatch)
    again = choices.of_model(later)
    assert again is not None and again.done and again.log == []  # no step ran under trial
    assert again.winners == measured.winners
    report = autoopt.report(later)
    assert report["channels_last"].detail.startswith(f"NCHW kept: {choices.RECORDED} (")
    assert report["trials"].detail.startswith(f"none: channels_last {choices.RECORDED}")
    assert report["trials"].figures == {"steps": 0, "cost_s": 0.0}
    assert later.features[0].weight.is_contiguous()


def test_without_a_compile_cache_nothing_is_recorded_and_each_run_measures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fit(False, monkeypatch)
    later = fit(False, monkeypatch)
    measured = choices.of_model(later)
    assert measured is not None and measured.log  # measured again
    assert not list(tmp_path.glob("*"))
