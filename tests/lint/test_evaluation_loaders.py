"""Evaluation loaders and loops beside a training loader (issue 21, precision class "the rule
speaks about an evaluation loop"): what the training side already sets, the evaluation side
leaves out by choice; what neither sets is reported on both."""

from __future__ import annotations

import pytest

from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.runner import lint_bytes

SCRIPT = """
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
train_loader = DataLoader(train_set, 64, shuffle=True{train_options})
val_loader = DataLoader(val_set, 64)
for epoch in range(3):
    model.train()
    for x, y in train_loader:
        x, y = x.to(device{copy}), y.to(device{copy})
        loss_fn(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            acc = (model(x.to(device)).argmax(1) == y.to(device)).float().mean()
"""


def _lines(code: str, train_options: str = "", copy: str = "") -> dict[str, list[int]]:
    source = SCRIPT.format(train_options=train_options, copy=copy)
    result = lint_bytes(source.encode(), "train.py", load_registry().all())
    found: dict[str, list[int]] = {}
    for d in result.diagnostics:
        found.setdefault(d.code, []).append(d.line)
    return {c: sorted(found.get(c, [])) for c in (code,)}


TRAIN_LINE, VAL_LINE = 6, 7


@pytest.mark.parametrize(
    ("code", "option"), [("AO101", ", num_workers=4"), ("AO102", ", pin_memory=True")]
)
def test_evaluation_loader_left_alone_where_the_training_loader_sets_it(
    code: str, option: str
) -> None:
    assert _lines(code, train_options=option) == {code: []}


@pytest.mark.parametrize("code", ["AO101", "AO102"])
def test_both_loaders_reported_where_neither_sets_it(code: str) -> None:
    assert _lines(code) == {code: [TRAIN_LINE, VAL_LINE]}


def test_evaluation_copies_left_alone_where_training_copies_are_non_blocking() -> None:
    assert _lines("AO103", copy=", non_blocking=True") == {"AO103": []}
    assert _lines("AO103") != {"AO103": []}  # neither: the training loop's copies are reported


FACTORY = """
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")

def create_dataloader(train):
    if train:
        return DataLoader(train_set, 8, shuffle=True{train_options})
    else:
        return DataLoader(test_set, batch_size=1, shuffle=False, num_workers=0)

train_loader = create_dataloader(True)
for x in train_loader:
    model(x.to(device, non_blocking=True)).sum().backward()
"""


@pytest.mark.parametrize(
    ("code", "option"), [("AO101", ", num_workers=4"), ("AO102", ", pin_memory=True")]
)
def test_the_else_of_a_train_flag_is_the_evaluation_loader(code: str, option: str) -> None:
    """voicefilter's `create_dataloader(hp, args, train)`: `if train:` builds the training
    loader with workers and pinned memory, `else:` a batch-of-one test loader without: the
    author's choice there. Where the training branch sets nothing, both are reported."""

    def lines(train_options: str) -> list[int]:
        source = FACTORY.format(train_options=train_options)
        result = lint_bytes(source.encode(), "train.py", load_registry().all())
        return sorted(d.line for d in result.diagnostics if d.code == code)

    assert lines(option) == []
    assert lines("") == [9, 11]
