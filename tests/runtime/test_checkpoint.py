"""The checkpoint pass with explicit segments (checkpoint=N) and its skipped cases; the budget
planning of checkpoint="auto" is tested in test_checkpoint_budget.py."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context
from autoopt.runtime.memory import saved_tensor_bytes
from autoopt.runtime.options import Options
from autoopt.runtime.passes import checkpoint as ckpt
from autoopt.runtime.report import Status

WIDTH = 16


def deep(layers: int = 12, dropout: float = 0.0, norm: bool = False) -> nn.Sequential:
    """`layers` blocks of Linear (+BatchNorm1d) + ReLU (+Dropout), flattened into one stack."""
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods.append(nn.Linear(WIDTH, WIDTH))
        if norm:
            mods.append(nn.BatchNorm1d(WIDTH))
        mods.append(nn.ReLU())
        if dropout:
            mods.append(nn.Dropout(dropout))
    return nn.Sequential(*mods)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.body = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(3)], deep(4))
        self.head = nn.Sequential(nn.Linear(WIDTH, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.stem(x)))


def _apply(model: nn.Module, checkpoint: object, device: str = "cpu") -> Context:
    ctx = Context(options=Options(checkpoint=checkpoint), model=model, loader=None, optimizer=None)
    ctx.device = torch.device(device)
    ctx.report.add(ckpt.run(ctx))
    return ctx


def _grads(model: nn.Module, x: torch.Tensor, seed: int = 0) -> list[torch.Tensor]:
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    torch.manual_seed(seed)
    out = model(x)
    (out.square().mean() + out.sum()).backward()
    return [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


@pytest.mark.parametrize("segments", [2, 3, 5])
def test_gradients_equal_the_plain_ones_with_dropout_and_batchnorm(segments: int) -> None:
    torch.manual_seed(0)
    plain = deep(8, dropout=0.3, norm=True)
    patched = copy.deepcopy(plain)
    result = _apply(patched, segments).report["checkpoint"]
    assert result.status is Status.APPLIED and f"{segments} segments" in result.detail
    x = torch.randn(6, WIDTH)
    for step in range(2):
        expected, got = _grads(plain, x, seed=step), _grads(patched, x, seed=step)
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=0)
    # The recomputation must not update batch-norm statistics a second time.
    for a, b in zip(plain.buffers(), patched.buffers(), strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    assert patched.state_dict().keys() == plain.state_dict().keys()


def test_saved_activation_bytes_are_lower_with_checkpointing() -> None:
    torch.manual_seed(0)
    model = deep(16)
    x = torch.randn(32, WIDTH)
    before = saved_tensor_bytes(lambda: model(x))
    _apply(model, 4)
    after = saved_tensor_bytes(lambda: model(x))
    assert after < before / 2
    # An evaluation forward runs the plain forward.
    model.eval()
    assert saved_tensor_bytes(lambda: model(x)) == before


def test_false_no_deep_stack_and_one_segment_are_skipped() -> None:
    assert _apply(deep(12), False).report["checkpoint"].status is Status.SKIPPED
    shallow = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(ckpt.MIN_LAYERS - 1)])
    result = _apply(shallow, 3).report["checkpoint"]
    assert result.status is Status.SKIPPED and ">= 8 layers" in result.detail
    one = _apply(deep(12), 1).report["checkpoint"]
    assert one.status is Status.SKIPPED and "one segment" in one.detail


def test_outermost_deep_stacks_are_found_by_name() -> None:
    net = Net()
    found = ckpt.find_deep_sequentials(net)
    assert [name for name, _ in found] == ["body.3"]  # body has 4 children, body.3 has 8
    # With a lower threshold body qualifies, and its nested stack is not patched separately.
    assert [name for name, _ in ckpt.find_deep_sequentials(net, min_layers=4)] == ["body"]
    nested = nn.Sequential(deep(6), *[nn.ReLU() for _ in range(7)])
    assert [name for name, _ in ckpt.find_deep_sequentials(nested)] == [""]
    inner = nn.Sequential(nn.Linear(WIDTH, WIDTH), deep(5))
    assert [name for name, _ in ckpt.find_deep_sequentials(inner)] == ["1"]


def test_int_segments_are_capped_and_applied_inside_a_module() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = deep(5)  # 10 children

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks(x)

    model = Holder()
    result = _apply(model, 50).report["checkpoint"]
    assert result.status is Status.APPLIED and "blocks (10 layers)" in result.detail
    assert model.blocks._autoopt_checkpoint.segments == 10


def test_through_optimize_gradients_match_and_report_says_applied() -> None:
    torch.manual_seed(0)
    plain = deep(8, dropout=0.2)
    model = autoopt.optimize(
        copy.deepcopy(plain), amp=False, compile=False, checkpoint=3, verbose=False
    )
    assert autoopt.report(model)["checkpoint"].status is Status.APPLIED
    x = torch.randn(4, WIDTH)
    for e, g in zip(_grads(plain, x), _grads(model, x), strict=True):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=0)


def test_choose_gives_segments_lazy_or_none() -> None:
    model = deep(16)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert ckpt.choose(3, model, cpu)[0] == 3
    assert ckpt.choose(1, model, cpu)[0] is None
    assert ckpt.choose(4, nn.Sequential(nn.Linear(2, 2)), cpu)[0] is None
    # "auto" plans block stacks only: a flat stack of mixed layers has none.
    decision, why = ckpt.choose("auto", model, cuda)
    assert decision is None and "no repeated block stack" in why
    blocks = nn.Sequential(*(deep(1) for _ in range(4)))
    assert ckpt.choose("auto", blocks, cuda)[0] == ckpt.LAZY  # "auto" budget: free CUDA memory
    assert ckpt.choose("auto", blocks, cpu, budget=1 << 20)[0] == ckpt.LAZY
    decision, why = ckpt.choose("auto", blocks, cpu)  # "auto" budget off CUDA: no limit
    assert decision is None and "pass memory_budget=<bytes>" in why
    assert ckpt.choose("auto", blocks, cuda, budget=None)[0] is None
    assert "forward" not in blocks[0].__dict__  # deciding patched nothing
