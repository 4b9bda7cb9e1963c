"""Memory budgets and the step-memory accounting the memory-aware passes plan with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.memory import (
    count_saved,
    format_bytes,
    optimizer_state_bytes,
    parse_budget,
    resident_bytes,
    resolve_budget,
    saved_tensor_bytes,
    state_memory,
)
from autoopt.runtime.options import Options


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("auto", "auto"),
        (None, None),
        (123, 123),
        ("2GiB", 2 << 30),
        ("800MB", 800_000_000),
        ("1.5 KiB", 1536),
        ("512mib", 512 << 20),
        ("4096", 4096),
    ],
)
def test_budget_forms_are_parsed(value: object, expected: object) -> None:
    assert parse_budget(value) == expected


@pytest.mark.parametrize("value", [0, -1, True, "2 parsecs", "GiB", "", 1.5, "0MB"])
def test_bad_budget_is_a_value_error_naming_the_forms(value: object) -> None:
    with pytest.raises(ValueError, match=r"optimize\(memory_budget=.*'2GiB'"):
        autoopt.optimize(nn.Linear(2, 2), memory_budget=value, verbose=False)


def test_options_store_the_budget_in_bytes() -> None:
    assert Options(memory_budget="1MiB").memory_budget == 1 << 20


def test_auto_budget_is_unlimited_off_cuda() -> None:
    assert resolve_budget("auto", torch.device("cpu")) is None
    assert resolve_budget(1000, torch.device("cpu")) == 1000


def test_state_memory_counts_parameters_gradients_and_adamw_state() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 1))
    model[1].weight.requires_grad_(False)  # frozen: no gradient, no optimizer state
    params = 4 * (100 + 10 + 10 + 1)
    trainable = params - 4 * 10
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    before = state_memory(model, optimizer)
    assert (before.parameters, before.gradients, before.optimizer_state) == (
        params,
        trainable,
        2 * trainable,
    )
    model(torch.randn(3, 10)).sum().backward()
    optimizer.step()
    # After a step the real state is counted; it matches the prediction (step counters aside).
    assert optimizer_state_bytes(optimizer) == 2 * trainable


def test_state_memory_counts_tied_parameters_once() -> None:
    embed = nn.Embedding(7, 4)
    head = nn.Linear(4, 7, bias=False)
    head.weight = embed.weight
    memory = state_memory(nn.ModuleDict({"embed": embed, "head": head}), None)
    assert memory.parameters == 7 * 4 * 4
    assert memory.optimizer_state == 0


def test_sgd_without_momentum_has_no_state() -> None:
    model = nn.Linear(3, 3)
    assert optimizer_state_bytes(torch.optim.SGD(model.parameters(), lr=0.1)) == 0
    with_momentum = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert optimizer_state_bytes(with_momentum) == 4 * 12


def test_saved_tensor_bytes_counts_activations_not_parameters() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    saved = saved_tensor_bytes(lambda: model(x))
    # Linear saves its input (x, then the ReLU output); ReLU saves its output (the same storage
    # as the second Linear's input). The weights are parameters and do not count.
    assert saved == 4 * (5 * 8 + 5 * 16)


def test_step_memory_renders_every_kind() -> None:
    memory = state_memory(nn.Linear(256, 256), None).with_activations(3 << 20)
    line = memory.render()
    assert "parameters 257 KiB" in line
    assert "activations 3 MiB" in line
    assert line.endswith(f"= {format_bytes(memory.total)}")


def test_auto_budget_on_cuda_adds_back_what_the_model_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1000, 8000))
    cuda = torch.device("cuda", 0)
    assert resolve_budget("auto", cuda) == 1000
    assert resolve_budget("auto", cuda, held=500) == 1500
    assert resolve_budget(64, cuda, held=500) == 64  # an explicit budget is the budget


def test_resident_bytes_counts_parameters_gradients_and_state_on_the_device() -> None:
    model = nn.Linear(4, 4)  # 20 floats
    optimizer = torch.optim.AdamW(model.parameters())
    cpu = torch.device("cpu")
    assert resident_bytes(model, optimizer, cpu) == 80  # no gradient, no state yet
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    # parameters + gradients + exp_avg + exp_avg_sq (+ the two scalar step counters)
    assert resident_bytes(model, optimizer, cpu) == 4 * 80 + 2 * 4
    assert resident_bytes(model, optimizer, torch.device("cuda", 0)) == 0


def test_saved_tensor_bytes_counts_reported_tensors_and_leaves_out_excluded_ones() -> None:
    x = torch.randn(10, 10, requires_grad=True)
    kept = torch.randn(5)

    def forward() -> None:
        x.relu()  # relu saves its output: 400 bytes
        count_saved(kept)  # kept outside autograd: 20 bytes
        count_saved(kept)  # one storage, counted once

    assert saved_tensor_bytes(forward) == 420
    assert saved_tensor_bytes(forward, exclude=[kept]) == 400
    count_saved(kept)  # outside a count: nothing to do
    # Nested counts are separate: the inner one does not leak into the outer.
    assert saved_tensor_bytes(lambda: saved_tensor_bytes(forward)) == 0
