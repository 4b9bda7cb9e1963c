"""amp="script": the precision is the script's own (its autocast/GradScaler, apex amp, or fp32
it keeps; what `rewrite --wrap` writes for such scripts). autoopt adds no autocast and no loss
scaling, but makes its other choices as usual: compile, the layout and the optimizer step are
measured, where amp=False would keep eager's fp32 kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import hardware
from autoopt.runtime.options import Options, eager_numerics
from autoopt.runtime.passes import amp as amp_pass
from autoopt.runtime.scaling.grad_scalers import _original_grad_scaler_scale
from autoopt.runtime.scaling.loss_scaling import scaler_of
from autoopt.runtime.trials import choices as trials
from autoopt.runtime.tune import plans

from .models import DropoutMLP, batches, cnn_data, mlp_data
from .test_amp_false_exact import DropoutCNN

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the measured choices of CPU")


def test_options_accept_script_and_name_it_among_the_choices() -> None:
    assert Options(amp="script").amp == "script"
    with pytest.raises(ValueError, match="'script'") as err:
        Options(amp="scripts")
    assert "amp must be one of: 'auto', 'bf16', 'fp16', 'script', False" in str(err.value)
    # not amp=False: the other choices are not asked to keep eager's kernels
    assert eager_numerics(Options(amp="script"), timed=True) is None
    assert eager_numerics(Options(amp=False), timed=True) is not None


def test_choose_adds_no_dtype_and_says_why() -> None:
    dtype, why = amp_pass.choose(nn.Linear(2, 2), torch.device("cpu"), "script")
    assert dtype is None and why == amp_pass.SCRIPT


def test_script_adds_no_autocast_and_no_loss_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU where amp="auto" would autocast in bf16 (faked), the forward stays in the
    script's precision: fp32 outputs without the script's autocast, bf16 ones inside it, no
    loss scaler and no GradScaler watch; the report says why."""
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)
    # torch's own scale() to start from (an earlier test's model may have left the watch on)
    monkeypatch.setattr(torch.amp.GradScaler, "scale", _original_grad_scaler_scale)
    model = nn.Sequential(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = autoopt.optimize(model, optimizer=opt, amp="script", compile=False, verbose=False)
    x, _ = mlp_data(8)
    assert model(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # the script's autocast, its outputs as they are
    with pytest.raises(ValueError, match="no loss scaler"):
        scaler_of(model)
    assert torch.amp.GradScaler.scale is _original_grad_scaler_scale
    result = autoopt.report(model)["amp"]
    assert result.status.value == "skipped" and result.detail == amp_pass.SCRIPT


def test_script_still_measures_compile_the_layout_and_the_step(tmp_path: Path) -> None:
    """The choices amp=False stands down are made as usual (here: measured on CPU)."""
    model = DropoutCNN()
    optimizer = torch.optim.AdamW(model.parameters())
    model, _ = autoopt.optimize(
        model, optimizer=optimizer, amp="script", compile_cache=tmp_path, verbose=False
    )
    report = autoopt.report(model)
    assert "amp=False" not in str(report)
    assert "kept only if training steps measure faster" in report["channels_last"].detail
    assert "measured against eager" in report["compile"].detail
    assert "timing fused, foreach, default" in report["backends"].detail


def test_a_loop_with_its_own_bf16_autocast_trains_as_without_autoopt(tmp_path: Path) -> None:
    """The script's own `torch.autocast("cpu", bf16)` around an amp="script" model: channels-last
    kept by the trial (a layout change, not a precision one) and the loss as the same loop
    without autoopt computes it, within bf16's rounding of NHWC kernels."""

    def fit(options: dict[str, object] | None) -> tuple[list[float], nn.Module]:
        torch.manual_seed(0)
        model: nn.Module = DropoutCNN()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        if options is not None:
            model, opt = autoopt.optimize(model, optimizer=opt, verbose=False, **options)
        torch.manual_seed(1)
        losses = []
        for xb, yb in batches(*cnn_data(64), 16):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, model

    reference, _ = fit(None)
    with trials.forced_winners(channels_last="channels_last"):
        ours, model = fit({"amp": "script", "compile": False, "compile_cache": tmp_path})
    layout = autoopt.report(model)["channels_last"]
    assert layout.status.value == "applied" and "channels_last" in layout.detail, layout.detail
    assert ours == pytest.approx(reference, rel=2e-2)


def test_tune_holds_script_in_every_plan() -> None:
    options = Options(amp="script", tune=True)
    candidates = plans.candidate_plans(DropoutMLP(), options)
    assert candidates and all(p.amp == "script" for p in candidates)
    assert candidates.count(candidates[0]) == 1  # the default plan is one of them, once
