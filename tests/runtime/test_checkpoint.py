"""The checkpoint pass: exact gradients, applied/skipped decisions, segments, lower memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import checkpoint as ckpt
from autoopt.runtime.report import Report, Status

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
    before = ckpt.saved_tensor_bytes(lambda: model(x))
    _apply(model, 4)
    after = ckpt.saved_tensor_bytes(lambda: model(x))
    assert after < before / 2
    # An evaluation forward runs the plain forward.
    model.eval()
    assert ckpt.saved_tensor_bytes(lambda: model(x)) == before


def test_meta_estimate_equals_the_real_saved_bytes() -> None:
    model = deep(10)
    x = torch.randn(8, WIDTH)
    real = ckpt.saved_tensor_bytes(lambda: model(x))
    assert ckpt.estimate_activation_bytes(model, x) == real
    # 10 ReLU outputs plus the input, each 8 x 16 float32
    assert real == 11 * 8 * WIDTH * 4


def test_false_no_deep_stack_and_one_segment_are_skipped() -> None:
    assert _apply(deep(12), False).report["checkpoint"].status is Status.SKIPPED
    shallow = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(ckpt.MIN_LAYERS - 1)])
    result = _apply(shallow, 3).report["checkpoint"]
    assert result.status is Status.SKIPPED and ">= 8 layers" in result.detail
    one = _apply(deep(12), 1).report["checkpoint"]
    assert one.status is Status.SKIPPED and "one segment" in one.detail


def test_auto_on_cpu_is_skipped_with_the_reason() -> None:
    model = deep(12)
    result = _apply(model, "auto").report["checkpoint"]
    assert result.status is Status.SKIPPED and "memory is rarely the limit" in result.detail
    assert not hasattr(model, "_autoopt_checkpoint")


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


def test_auto_decision_at_first_forward_uses_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path of "auto", run on CPU with the free-memory probe pinned."""
    # 64 rows: activations (17 x 64 x 16 floats) exceed twice the gradients (16 x 272 floats).
    x = torch.randn(64, WIDTH)
    for free, expect_applied in ((10**12, False), (1000, True)):
        model = deep(16)
        report = Report()
        report.add(ckpt.PassResult.skipped("checkpoint", "pending"))
        decisions = ckpt._Decisions(report, pending=1)
        ckpt._patch(model, ckpt.CheckpointState("", None, decisions))
        monkeypatch.setattr(ckpt, "free_device_memory", lambda device, free=free: free)
        with torch.no_grad():
            model(x)  # not a training forward: still undecided
        assert model._autoopt_checkpoint.segments is None
        plain = ckpt.saved_tensor_bytes(lambda m=model: m(x))
        state = model._autoopt_checkpoint
        assert state.estimate_bytes == 17 * 64 * WIDTH * 4
        result = report["checkpoint"]
        if expect_applied:
            assert state.segments == ckpt.default_segments(32) == 6
            assert result.status is Status.APPLIED and "6 segments" in result.detail
            assert plain < state.estimate_bytes  # the first forward was already checkpointed
        else:
            assert state.segments == 0 and result.status is Status.SKIPPED
            assert "not needed" in result.detail and plain == state.estimate_bytes


def test_auto_does_not_checkpoint_when_gradients_dominate(monkeypatch: pytest.MonkeyPatch) -> None:
    model = deep(16)
    report = Report()
    report.add(ckpt.PassResult.skipped("checkpoint", "pending"))
    ckpt._patch(model, ckpt.CheckpointState("", None, ckpt._Decisions(report, 1)))
    monkeypatch.setattr(ckpt, "free_device_memory", lambda device: 1000)  # memory is tight
    model(torch.randn(2, WIDTH))  # 2 rows: activations far below the gradient memory
    assert model._autoopt_checkpoint.segments == 0
    assert "of gradients" in report["checkpoint"].detail


def test_default_segments_is_about_sqrt() -> None:
    assert ckpt.default_segments(72) == 8
    assert ckpt.default_segments(144) == 12
    assert ckpt.default_segments(8) == 3


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
    assert ckpt.choose("auto", model, cuda)[0] == ckpt.LAZY
    segments, why = ckpt.choose("auto", model, cpu)
    assert segments is None and "pass checkpoint=<segments>" in why
    assert ckpt.choose(1, model, cpu)[0] is None
    assert ckpt.choose(4, nn.Sequential(nn.Linear(2, 2)), cpu)[0] is None
    assert "forward" not in model.__dict__  # deciding patched nothing
