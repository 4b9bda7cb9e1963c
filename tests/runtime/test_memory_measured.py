"""The memory plan against torch's profiler: a measurement sharing no code with the planner
(benchmarks/memory_measured.py; figures for the benchmark's GPT in docs/benchmarks/memory.md)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.memory_measured import allocated_peak, planned_and_measured
from tests.runtime.checkpoint_models import GPT


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, 64, (8, 49), generator=torch.Generator().manual_seed(0))
    return tokens[:, :-1], tokens[:, 1:]


def test_the_profiler_peak_is_the_allocators() -> None:
    """The independent measure itself, on allocations whose sizes torch fixes."""

    def work() -> None:
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 8 MB held at once
        del a
        c = b + 1  # 8 MB again, after `a` was freed
        del b, c

    assert allocated_peak(work) == pytest.approx(8_000_000, abs=1024)


def test_a_later_measurement_counts_only_its_own_allocations() -> None:
    """The profiler's running total is the process's: a first measured run that leaves 10 MB
    alive (a step's gradients) must not be counted again in the next one's peak."""
    kept = []
    assert allocated_peak(lambda: kept.append(torch.empty(10_000_000, dtype=torch.uint8))) == (
        pytest.approx(10_000_000, abs=1024)
    )
    assert allocated_peak(lambda: torch.empty(1_000_000, dtype=torch.uint8)) == pytest.approx(
        1_000_000, abs=1024
    )


@pytest.mark.parametrize("fraction", [1.0, 0.34], ids=["eager", "a third"])
def test_planned_peak_is_within_10_percent_of_the_measured_one(fraction: float) -> None:
    """Gradients kept between steps (`zero_grad(set_to_none=False)`): every kind the plan adds
    is alive at the forward's end, so plan and measure must agree."""
    torch.manual_seed(0)
    row = planned_and_measured(
        GPT(vocab=64, width=64, layers=4, heads=4), _batch(), fraction, False
    )
    if fraction < 1:
        assert row["blocks"] != "none"  # the budget did make it checkpoint
    assert abs(row["planned"] - row["measured"]) <= 0.10 * row["measured"], row


def test_with_gradients_freed_the_plan_does_not_underestimate() -> None:
    """`zero_grad()` frees the gradients before the forward, so the plan (which counts them as
    resident) may be above the measured peak, never more than 10% below it: a step planned to
    fit its budget fits."""
    torch.manual_seed(0)
    row = planned_and_measured(GPT(vocab=64, width=64, layers=4, heads=4), _batch(), 0.34, True)
    assert row["measured"] <= 1.10 * row["planned"], row


def test_the_plans_peak_counts_the_backwards_transient_buffers() -> None:
    """The selftest's transformer at its full batch: the step's peak is inside the last block's
    backward (its gradients and their temporaries on top of every saved activation), which the
    saved bytes alone put 11% under the profiler's measure."""
    from autoopt.diagnostics.selftest import TinyLM

    tokens = torch.randint(0, 64, (8, 65), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    row = planned_and_measured(TinyLM(), (tokens[:, :-1], tokens[:, 1:]), 1 / 3, False)
    assert row["blocks"] != "none"
    assert abs(row["planned"] - row["measured"]) <= 0.05 * row["measured"], row


def test_backward_transient_bytes_is_the_profilers_backward_peak() -> None:
    """An MLP's forward and backward under torch's profiler: its peak is the saved tensors, the
    output, and the backward's transient buffers counted op by op."""
    from autoopt.runtime.memory import backward_transient_bytes, saved_tensor_bytes

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    x = torch.randn(512, 64, requires_grad=True)
    counted = backward_transient_bytes(lambda: mlp(x), mlp.parameters())
    assert all(p.grad is None for p in mlp.parameters())  # put back as they were
    saved = saved_tensor_bytes(lambda: mlp(x)) + 512 * 64 * 4  # and the output
    for p in mlp.parameters():
        p.grad = torch.zeros_like(p)
    x.grad = torch.zeros_like(x)

    def step() -> None:
        out = mlp(x)
        out.backward(torch.ones_like(out))

    measured = allocated_peak(step)
    assert saved + counted == pytest.approx(measured, rel=0.05)
