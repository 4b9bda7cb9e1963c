"""The memory plan: the report's memory section after the first training step, and
`explain_memory()`; bytes checked against saved tensors counted here with torch's own hooks."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.checkpointing.block_checkpoint import STATE_ATTR, Mode
from autoopt.runtime.memory import (
    MemoryPlan,
    StepMemory,
    format_bytes,
    saved_tensor_bytes,
)
from autoopt.runtime.report import Report, record_plan
from tests.runtime.checkpoint_models import GPT
from tests.runtime.saved_bytes import hooked_saved_bytes


def _tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (4, 24), generator=torch.Generator().manual_seed(seed))


def _adamw_state(model: nn.Module) -> StepMemory:
    """Parameters, gradients and AdamW's two moments, in bytes, counted here."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return StepMemory(parameters=size, gradients=size, optimizer_state=2 * size)


def _budget(model: nn.Module, x: torch.Tensor, share: float) -> int:
    """The state bytes plus `share` of what the eager forward saves."""
    return _adamw_state(model).state + int(share * hooked_saved_bytes(lambda: model(x), model))


def _optimize(model: nn.Module, budget: int) -> nn.Module:
    optimizer = torch.optim.AdamW(model.parameters())
    model, _ = autoopt.optimize(
        model,
        None,
        optimizer,
        amp=False,
        compile=False,
        channels_last=False,
        memory_budget=budget,
        verbose=False,
    )
    return model


def test_report_shows_the_step_before_and_after_checkpointing_after_the_first_step() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    budget = _budget(plain, x, share=0.5)
    model = _optimize(copy.deepcopy(plain), budget)
    report = autoopt.report(model)
    assert report.memory is None and "memory per rank" not in str(report)

    model(x).sum().backward()
    memory = report.memory
    assert memory is not None and memory.budget == budget
    state = _adamw_state(plain)
    assert memory.before == state.with_activations(hooked_saved_bytes(lambda: plain(x), plain))
    # A selective checkpoint's cache is kept outside autograd's hooks: `saved_tensor_bytes`
    # counts it too (the plan's own measure; test_checkpoint_budget checks it on its own).
    assert memory.after == state.with_activations(saved_tensor_bytes(lambda: model(x)))
    assert memory.after.total <= budget < memory.before.total
    text = str(report)
    assert f"memory per rank (budget {format_bytes(budget)})" in text
    assert f"  before  {memory.before.render()}" in text
    assert f"  after   {memory.after.render()}" in text


def test_verbose_logs_the_decision_and_the_memory_section_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    x = _tokens()
    model = GPT(layers=2)
    budget = _budget(model, x, share=0.5)
    optimizer = torch.optim.AdamW(model.parameters())
    model, _ = autoopt.optimize(model, None, optimizer, amp=False, memory_budget=budget)
    with caplog.at_level(logging.INFO, logger="autoopt"):
        model(x).sum().backward()
        report = autoopt.report(model)
        assert report.memory is not None
        said = [r.getMessage() for r in caplog.records]
        assert said == [
            f"autoopt: checkpoint applied: {report['checkpoint'].detail}",
            "\n".join(report.memory.render()),
        ]
        caplog.clear()
        model(x).sum().backward()
        assert caplog.records == []


def test_each_pass_changes_its_own_kinds_in_either_order() -> None:
    unsharded, sharded = StepMemory(100, 100, 200), StepMemory(50, 50, 100)
    fsdp = (unsharded, sharded, None)  # FSDP: state bytes, activations not measured
    checkpoint = (sharded.with_activations(1000), sharded.with_activations(300), 2000)
    expected = MemoryPlan(unsharded.with_activations(1000), sharded.with_activations(300), 2000)
    first = Report()
    record_plan(first, *fsdp)
    assert record_plan(first, *checkpoint) == expected == first.memory
    # The other order keeps the earliest state and the latest activations alike.
    second = Report()
    record_plan(second, unsharded.with_activations(1000), unsharded.with_activations(300), 2000)
    assert record_plan(second, *fsdp) == expected


def test_explain_memory_measures_every_block_and_decides_as_training_does() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=4)
    x = _tokens()
    budget = _budget(plain, x, share=0.5)
    rng = torch.get_rng_state()
    weights = [p.clone() for p in plain.parameters()]

    explained = autoopt.explain_memory(plain, x, memory_budget=budget, amp=False)

    # The model, its parameters and the RNG are as they were.
    assert not hasattr(plain.blocks[0], STATE_ATTR)
    assert all(torch.equal(a, b) for a, b in zip(weights, plain.parameters(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())
    # Each block: a full checkpoint keeps its input, plain keeps what the block itself saves.
    inputs: list[torch.Tensor] = []
    hooks = [b.register_forward_pre_hook(lambda m, a: inputs.append(a[0])) for b in plain.blocks]
    with torch.no_grad():
        plain(x)
    for hook in hooks:
        hook.remove()
    assert [b.name for b in explained.blocks] == [f"blocks.{i}" for i in range(4)]
    for block, module, h in zip(explained.blocks, plain.blocks, inputs, strict=True):
        assert block.type == "Block"
        assert block.cost.full == h.numel() * h.element_size()
        fresh = h.detach().requires_grad_(True).clone()
        mask = torch.ones(24, 24, dtype=torch.bool).tril()
        alone = hooked_saved_bytes(lambda: module(fresh, mask=mask), plain, mask)  # noqa: B023
        assert block.cost.plain == alone
        assert block.cost.full < block.cost.selective < block.cost.plain
    # Before/after and the chosen blocks are what a training run under the same budget gets.
    model = _optimize(copy.deepcopy(plain), budget)
    model(x).sum().backward()
    trained = autoopt.report(model).memory
    assert trained is not None
    assert explained.memory == trained
    assert [b.mode for b in explained.blocks] == [getattr(b, STATE_ATTR).mode for b in model.blocks]
    assert any(b.mode is not Mode.PLAIN for b in explained.blocks)
    assert explained.memory.before.activations == hooked_saved_bytes(lambda: plain(x), plain)
    text = "\n".join(explained.render())
    assert "blocks.0" in text and format_bytes(explained.blocks[0].cost.selective) in text


def test_explain_memory_without_a_budget_measures_and_checkpoints_nothing() -> None:
    torch.manual_seed(0)
    plain = GPT(layers=2)
    x = _tokens()
    explained = autoopt.explain_memory(plain, x, memory_budget=None, amp=False)
    assert explained.memory.budget is None
    assert [b.mode for b in explained.blocks] == [Mode.PLAIN, Mode.PLAIN]
    assert explained.memory.before == explained.memory.after
    assert explained.memory.before == _adamw_state(plain).with_activations(
        hooked_saved_bytes(lambda: plain(x), plain)
    )
    assert "no memory budget" in explained.decision
    assert explained.render()[-4] == "memory per rank (no budget)"


def test_explain_memory_of_a_model_without_blocks_counts_its_forward() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    x = torch.randn(16, 8)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    explained = autoopt.explain_memory(model, x, optimizer=sgd, memory_budget="1MiB", amp=False)
    size = sum(p.numel() * 4 for p in model.parameters())
    saved = hooked_saved_bytes(lambda: model(x), model)
    assert explained.blocks == [] and explained.optimizer == "SGD"
    assert explained.memory.before == StepMemory(size, size, size, saved)  # momentum: 1 tensor
    assert explained.memory.budget == 1 << 20
    assert "no repeated block stack" in explained.decision
