"""The amp pass: dtype choice and reason, fp32 outputs, agreement with eager fp32."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import forward, hardware
from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import amp

from .models import MLP, SmallCNN, cnn_data


def test_amp_false_is_skipped_with_reason() -> None:
    result = autoopt.report(autoopt.optimize(MLP(), amp=False, verbose=False))["amp"]
    assert result.status.value == "skipped" and result.detail == "amp=False"


def test_auto_leaves_a_half_precision_model_alone() -> None:
    model = MLP().to(torch.bfloat16)
    result = autoopt.report(autoopt.optimize(model, verbose=False))["amp"]
    assert result.status.value == "skipped"
    assert "already bfloat16" in result.detail


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        h = self.lin(x)
        return {"h": h, "pair": (h * 2, h.argmax(1)), "n": 3}


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_floating_outputs_come_back_fp32_in_any_nesting(amp: str) -> None:
    model = autoopt.optimize(DictOut(), amp=amp, verbose=False)
    out = model(torch.randn(4, 8))
    assert out["h"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1].dtype == torch.int64 and out["n"] == 3
    # The computation really ran in low precision: the Linear's output was rounded.
    with torch.autocast("cpu", dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[amp])):
        assert model.lin(torch.randn(4, 8)).dtype != torch.float32


def test_bf16_outputs_and_gradients_agree_with_fp32() -> None:
    """Tolerance: bf16 keeps 8 mantissa bits (relative rounding 2**-9 ~ 0.2% per op); through two
    convolutions, a batch norm and a linear layer we allow 3% relative L2 error on outputs and
    10% on gradients (the backward rounds again, and batch norm's backward amplifies it; measured
    ~6% on the first convolution). A wrong computation is off by ~100%; one in fp32 by 0."""
    torch.manual_seed(0)
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    fast = autoopt.optimize(model, amp="bf16", compile=False, verbose=False)
    x, y = cnn_data(16)
    loss_fn = nn.CrossEntropyLoss()

    out_ref = reference(x)
    loss_fn(out_ref, y).backward()
    out = fast(x)
    loss_fn(out, y).backward()

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    assert out.dtype == torch.float32
    assert 0 < rel(out, out_ref) < 0.03  # > 0: it did run in bf16
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref_grads = torch.cat([q.grad.flatten() for q in reference.parameters()])
    assert rel(grads, ref_grads) < 0.10
    # Per parameter too; the first conv's bias feeds a batch norm, so its true gradient is ~0:
    # allow an absolute slack of 0.1% of the whole gradient's norm.
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert (p.grad - q.grad).norm() <= 0.10 * q.grad.norm() + 1e-3 * ref_grads.norm()


def _amp_only(model: nn.Module, dtype: str) -> nn.Module:
    """The amp pass alone installed on `model`: copies and pickling of its layers are tested
    here; every other pass's layers in their own tests."""
    ctx = Context(options=Options(amp=dtype), model=model, loader=None, optimizer=None)
    amp.run(ctx)
    forward.install(ctx)
    return model


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_deep_copy_computes_with_its_own_weights(dtype: str) -> None:
    """An EMA copy must not call the original's forward (a closure over its bound method did)."""
    torch.manual_seed(0)
    model = _amp_only(MLP(), dtype)
    x = torch.randn(4, 16)
    before = model(x).detach()
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(x), before)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert torch.equal(twin(x), torch.zeros_like(before))
    assert torch.equal(model(x).detach(), before)
    assert twin(x).dtype == torch.float32  # the copy kept its autocast layer


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_torch_save_and_load_round_trip(dtype: str) -> None:
    torch.manual_seed(0)
    model = _amp_only(MLP(), dtype)
    x = torch.randn(4, 16)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x), model(x))
    with torch.no_grad():
        next(loaded.parameters()).zero_()
    assert not torch.equal(loaded(x), model(x))


def test_choose_is_pure_and_says_why() -> None:
    model = MLP()
    cpu = torch.device("cpu")
    assert amp.choose(model, cpu, False) == (None, "amp=False")
    assert amp.choose(model, cpu, "fp16") == (torch.float16, "amp='fp16'")
    assert amp.choose(model.to(torch.bfloat16), cpu, "auto")[0] is None
    assert not hasattr(model, "_autoopt_loss_scaler") and model.forward.__self__ is model


@pytest.mark.slow  # a fresh interpreter imports torch
def test_torch_load_in_a_fresh_process(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _amp_only(MLP(), "fp16")
    x = torch.randn(4, 16)
    torch.save({"model": model, "x": x, "y": model(x).detach()}, tmp_path / "m.pt")
    code = (
        "import torch; d = torch.load(r'%s', weights_only=False); "
        "torch.testing.assert_close(d['model'](d['x']), d['y']); print('ok')" % (tmp_path / "m.pt")
    )
    root = Path(__file__).resolve().parents[1]  # where pytest imported `runtime.models` from
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr


class Timed(nn.Module):
    """Records whether each forward ran under autocast and advances a simulated clock by the
    cost given for that precision; BatchNorm shows whether trial forwards leave buffers alone."""

    def __init__(self, bf16_cost: float, fp32_cost: float) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.costs = {True: bf16_cost, False: fp32_cost}
        self.now = 0.0
        self.autocast_seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        on = torch.is_autocast_enabled("cpu")
        self.autocast_seen.append(on)
        self.now += self.costs[on]
        return self.bn(self.lin(x))


def _first_forward(
    monkeypatch: pytest.MonkeyPatch, model: Timed, steps: int = 1, **options: object
) -> tuple[Timed, torch.Tensor]:
    """`steps` training steps (forward and backward; no optimizer, so each forward is a step of
    the trials), then the output of one more forward."""
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    monkeypatch.setattr(amp, "CLOCK", lambda: model.now)
    optimized = autoopt.optimize(model, device="cpu", compile=False, verbose=False, **options)
    torch.manual_seed(0)
    for _ in range(steps - 1):
        optimized(torch.randn(16, 8)).sum().backward()
    return optimized, optimized(torch.randn(16, 8))


def test_auto_on_cpu_drops_bf16_when_fp32_measures_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    model, out = _first_forward(monkeypatch, Timed(bf16_cost=2.0, fp32_cost=1.0), steps=7)
    result = autoopt.report(model)["amp"]
    assert result.status.value == "skipped"
    assert result.detail.startswith("fp32 kept: fp32 1 s ±0% (2 steps), bf16 2 s ±0% (2 steps)")
    assert "bf16 50% slower (within the noise: ±0%, 2 rounds)" in result.detail
    assert result.figures["bf16_s"] == 2.0 and result.figures["fp32_samples"] == 2
    # A warm-up step each, then two rounds side by side, fp32 (the baseline) first (a 2x lead
    # settles after two rounds: trials.DECISIVE), then fp32 from step 7 on; no step ran twice.
    assert model.autocast_seen == [False, True] * 3 + [False]
    schedule = autoopt.report(model)["trials"]
    assert "training steps 1-6 amp, winners from step 7" in schedule.detail, schedule.detail
    assert schedule.figures["steps"] == 6
    assert out.dtype == torch.float32 and model.autocast_seen[-1] is False


def test_auto_on_cpu_keeps_bf16_when_it_measures_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _first_forward(monkeypatch, Timed(bf16_cost=1.0, fp32_cost=3.0), steps=7)
    result = autoopt.report(model)["amp"]
    assert result.status.value == "applied"
    assert result.detail == (
        "bf16 autocast: fp32 3 s ±0% (2 steps), bf16 1 s ±0% (2 steps): bf16 3x faster "
        "(beyond the noise: ±0%, 2 rounds)"
    )
    assert model.autocast_seen[-1] is True


def test_until_decided_the_report_says_the_trials_are_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, _ = _first_forward(monkeypatch, Timed(bf16_cost=1.0, fp32_cost=3.0))
    result = autoopt.report(model)["amp"]
    assert "kept only if training steps measure faster" in result.detail, result.detail
    assert model.autocast_seen == [False]  # the first step runs as eager's, nothing else ran


def test_without_a_training_step_bf16_is_never_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    """amp="auto" on a CPU with native bf16 is decided by training steps: a model used for
    inference only computes what plain torch computes in fp32, in eval mode and in train mode
    without gradients."""
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    torch.manual_seed(0)
    plain = MLP()
    model = autoopt.optimize(copy.deepcopy(plain), compile=False, verbose=False)
    x = torch.randn(8, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)
        model.eval()
        torch.testing.assert_close(model(x), plain.eval()(x), rtol=0, atol=0)


def test_an_explicit_bf16_is_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _first_forward(monkeypatch, Timed(bf16_cost=2.0, fp32_cost=1.0), amp="bf16")
    assert model.autocast_seen == [True]
    assert "measured" not in autoopt.report(model)["amp"].detail


class TimedStack(nn.Module):
    """Two same-kind blocks (a stack checkpoint='auto' plans for) on a simulated clock shared by
    copies (explain_memory works on one): fp32 measures faster."""

    now = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)) for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        TimedStack.now += 2.0 if torch.is_autocast_enabled("cpu") else 1.0
        for block in self.blocks:
            x = x + block(x)
        return x


def test_the_trials_add_no_forward_to_the_memory_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # checkpoint='auto' measures what the first training forward saves: the trials run no
    # forward of their own (the first step runs in fp32, as eager's), so it measures that step
    # alone, as with amp=False.
    x = torch.randn(16, 8)
    fixed = autoopt.explain_memory(TimedStack(), x, memory_budget=None, amp=False)
    monkeypatch.setattr(TimedStack, "now", 0.0)
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    monkeypatch.setattr(amp, "CLOCK", lambda: TimedStack.now)
    measured = autoopt.explain_memory(TimedStack(), x, memory_budget=None)
    assert TimedStack.now == 1.0  # one forward, in fp32
    assert len(measured.blocks) == 2
    assert measured.memory.before.activations == fixed.memory.before.activations > 0

    def saved(blocks: list) -> list:  # bytes; the modes' seconds are timed on each run
        return [(b.cost.plain, b.cost.selective, b.cost.full, b.cost.transient) for b in blocks]

    assert saved(measured.blocks) == saved(fixed.blocks)
