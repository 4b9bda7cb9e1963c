"""The channels_last pass: heuristic, model and input conversion, fallback for `.view`."""

from __future__ import annotations

import copy
import inspect
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.passes import channels_last as cl_pass

from .models import MLP, SmallCNN, ViewCNN, batches, cnn_data, train
from .plain_loop import assert_same_training, train_by_hand

CL = torch.channels_last


class BigHead(nn.Module):
    """One tiny conv under a huge classifier: convolutions are not where the time goes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.head = nn.Linear(2 * 16 * 16, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.conv(x), 1))


def test_heuristic() -> None:
    assert cl_pass.conv_share(SmallCNN()) > 0.9
    assert cl_pass.conv_share(MLP()) == 0.0
    assert cl_pass.conv_share(BigHead()) < 0.5


def test_conv_model_is_converted_in_place() -> None:
    model = SmallCNN()
    params = list(model.parameters())
    # Pinned: "auto" on CPU starts in NCHW and measures (tests/runtime/test_trials.py).
    model = autoopt.optimize(model, amp=False, channels_last=True, verbose=False)
    result = autoopt.report(model)["channels_last"]
    assert result.status.value == "applied" and "channels_last=True" in result.detail
    assert list(model.parameters())[0] is params[0]  # same Parameter objects
    assert model.features[0].weight.is_contiguous(memory_format=CL)
    seen = []
    model.features[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    model(torch.randn(2, 3, 16, 16))  # a contiguous NCHW input from the user
    assert seen[0].is_contiguous(memory_format=CL)


@pytest.mark.parametrize(
    ("model", "reason"),
    [(MLP(), "no Conv2d layers"), (BigHead(), "of the estimated compute")],
)
def test_skipped_with_reason(model: nn.Module, reason: str) -> None:
    result = autoopt.report(autoopt.optimize(model, verbose=False))["channels_last"]
    assert result.status.value == "skipped" and reason in result.detail


def test_false_is_skipped_and_true_forces() -> None:
    off = autoopt.optimize(SmallCNN(), channels_last=False, verbose=False)
    assert autoopt.report(off)["channels_last"].detail == "channels_last=False"
    assert off.features[0].weight.is_contiguous()
    forced = autoopt.optimize(BigHead(), channels_last=True, amp=False, verbose=False)
    assert autoopt.report(forced)["channels_last"].status.value == "applied"
    assert forced.conv.weight.is_contiguous(memory_format=CL)


def test_view_after_convs_falls_back_and_trains() -> None:
    torch.manual_seed(0)
    reference = ViewCNN()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    x, y = cnn_data(64)
    out = model(x[:8])  # the first forward fails in NHWC and is retried in NCHW
    torch.testing.assert_close(out, reference(x[:8]), rtol=1e-4, atol=1e-5)
    result = autoopt.report(model)["channels_last"]
    assert result.status.value == "failed" and "view" in result.detail
    assert result.fallback == "contiguous (NCHW) model and inputs"
    assert model.features[0].weight.is_contiguous()
    losses = train(model, optimizer, batches(x, y, 16), epochs=4)
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4])
    # After the fallback: the plain NCHW loop in torch, step for step (the reference already ran
    # one forward above, as the model did; no parameter changed there).
    expected = train_by_hand(
        reference, torch.optim.SGD(reference.parameters(), lr=0.05), batches(x, y, 16), 4
    )
    assert_same_training(losses, expected, None)


class LaterViews(SmallCNN):
    """Flattens with `.view()` on paths the first training forward does not take: every third
    training call, and in eval mode (an evaluation head)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.features(x)
        if not self.training or self.calls % 3 == 0:
            return self.head(h.view(h.size(0), -1))
        return self.head(torch.flatten(h, 1))


def test_a_view_on_a_later_path_falls_back_there_and_trains_like_eager() -> None:
    """The guard lasts: a `.view()` met at the third training step (crashed on main: the guard
    was off after the first forward), then in evaluation; the losses, the evaluation and the
    parameters are plain NCHW torch's."""
    torch.manual_seed(0)
    reference = LaterViews()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    x, y = cnn_data(64)
    torch.manual_seed(1)
    losses = train(model, optimizer, batches(x, y, 16))
    torch.manual_seed(1)
    expected = train_by_hand(reference, torch.optim.SGD(reference.parameters(), lr=0.05),
                             batches(x, y, 16))  # fmt: skip
    assert_same_training(losses, expected, None)
    assert autoopt.report(model)["channels_last"].status.value == "failed"
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), reference.eval()(x), rtol=1e-4, atol=1e-5)


def test_an_eval_only_view_falls_back_at_the_first_evaluation() -> None:
    torch.manual_seed(0)
    reference = LaterViews()
    reference.calls = 1  # no third training call before the evaluation
    model = autoopt.optimize(copy.deepcopy(reference), amp=False, channels_last=True,
                             verbose=False)  # fmt: skip
    x, _ = cnn_data(16)
    model(x).sum().backward()  # a training forward in channels_last succeeds
    reference(x).sum().backward()  # (its BatchNorm statistics move alike)
    assert model.features[0].weight.is_contiguous(memory_format=CL)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), reference.eval()(x), rtol=1e-4, atol=1e-5)
    assert model.features[0].weight.is_contiguous()


def test_channels_last_trains_like_channels_last_by_hand() -> None:
    """Applied (forced, fp32): the same losses as the model and inputs converted by hand."""
    torch.manual_seed(0)
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    assert autoopt.report(model)["channels_last"].status.value == "applied"
    x, y = cnn_data(64)
    losses = train(model, optimizer, batches(x, y, 16), epochs=3)
    expected = train_by_hand(
        reference,
        torch.optim.SGD(reference.parameters(), lr=0.05),
        batches(x, y, 16),
        3,
        channels_last=True,
    )
    assert_same_training(losses, expected, None)


class StereoNet(nn.Module):
    """PSMNet's shape: 2-D feature extraction, then a 3-D convolution over a cost volume."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.volume = nn.Conv3d(1, 1, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cost = self.volume(self.features(x).unsqueeze(1)).squeeze(1)
        return self.head(cost.mean((2, 3)))


def test_a_model_with_a_conv3d_keeps_its_5d_weights_and_trains_like_eager() -> None:
    """`Module.to(memory_format=torch.channels_last)` raises on a Conv3d's 5-D weight: the pass
    converts the 4-D tensors only, and the model trains as the user's own fp32 loop does."""
    torch.manual_seed(0)
    reference = StereoNet()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    assert autoopt.report(model)["channels_last"].status.value == "applied"
    conv2d, conv3d = model.features[0].weight, model.volume.weight
    assert conv2d.is_contiguous(memory_format=torch.channels_last) and not conv2d.is_contiguous()
    assert conv3d.is_contiguous()
    x, y = cnn_data(64)
    losses = train(model, optimizer, batches(x, y, 16), epochs=2)
    expected = train_by_hand(
        reference, torch.optim.SGD(reference.parameters(), lr=0.05), batches(x, y, 16), 2
    )
    assert_same_training(losses, expected, None)


def test_a_user_error_is_not_blamed_on_channels_last() -> None:
    model = autoopt.optimize(SmallCNN(), amp=False, channels_last=True, verbose=False)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5, 16, 16))  # wrong channel count: fails in any format
    assert autoopt.report(model)["channels_last"].status.value == "applied"
    assert model.features[0].weight.is_contiguous(memory_format=CL)


def test_loader_batches_keep_the_users_layout() -> None:
    # channels-last lives inside the model: the loop sees the batches it would without autoopt
    # (issue 22: `x.view(B, -1)` on a batch must keep working); the model converts them.
    x, y = cnn_data(8)
    model, loader = autoopt.optimize(
        SmallCNN(), batches(x, y, 4), channels_last=True, verbose=False
    )
    xb, yb = next(iter(loader))
    assert xb.is_contiguous() and not xb.is_contiguous(memory_format=CL)
    assert model.features[0].weight.is_contiguous(memory_format=CL)
    assert yb.dtype == torch.int64


def test_view_fallback_under_compile_blames_channels_last_not_compile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autoopt.runtime.passes import compile as compile_pass

    monkeypatch.setattr(compile_pass, "BACKEND", "aot_eager")  # real dynamo, no C++ codegen
    model = autoopt.optimize(ViewCNN(), compile=True, channels_last=True, amp=False, verbose=False)
    model(torch.randn(2, 3, 16, 16))
    report = autoopt.report(model)
    assert report["channels_last"].status.value == "failed"
    assert report["compile"].status.value == "applied"


class DropoutViewCNN(ViewCNN):
    """Dropout, then `.view`: the failed NHWC attempt has updated BatchNorm and drawn a mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(self.features(x), 0.3, self.training)
        return self.head(h.view(h.size(0), -1))


def test_the_fallback_undoes_the_failed_attempt_before_rerunning() -> None:
    torch.manual_seed(0)
    reference = DropoutViewCNN()
    model = copy.deepcopy(reference)
    x, y = cnn_data(32)
    runs = []
    for net, opts in ((reference, None), (model, {"amp": False, "channels_last": True})):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        if opts is not None:
            net, optimizer = autoopt.optimize(net, optimizer=optimizer, verbose=False, **opts)
        torch.manual_seed(1)  # the same dropout masks, if the failed attempt drew none
        runs.append(train(net, optimizer, batches(x, y, 8), epochs=2))
    assert autoopt.report(model)["channels_last"].status.value == "failed"
    # Tolerance: fp32 rounding; BatchNorm statistics counted twice were off by ~0.5.
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-4, atol=1e-5)
    norm, norm_ref = model.features[1], reference.features[1]
    assert int(norm.num_batches_tracked) == int(norm_ref.num_batches_tracked) == 8
    torch.testing.assert_close(norm.running_mean, norm_ref.running_mean, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.eval()(x), reference.eval()(x), rtol=1e-4, atol=1e-5)


def test_choose_decides_without_touching_the_model() -> None:
    model = SmallCNN()
    assert cl_pass.choose("auto", model)[0] is True
    assert model.features[0].weight.is_contiguous()  # deciding changed nothing
    assert cl_pass.choose("auto", MLP()) == (False, "the model has no Conv2d layers")
    assert cl_pass.choose(True, BigHead())[0] is True
    assert cl_pass.choose(False, model) == (False, "channels_last=False")


@pytest.mark.parametrize("option", ["auto", True])
def test_lazy_modules_stand_down_until_materialized(option: str | bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    plain = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = autoopt.optimize(model, None, opt, amp=False, channels_last=option, verbose=False)
    assert "lazy parameters" in autoopt.report(model)[cl_pass.NAME].detail
    x = torch.randn(2, 3, 8, 8)
    torch.manual_seed(1)  # the first forward materializes the parameters from the global RNG
    model(x).sum().backward()
    torch.manual_seed(1)
    plain(x).sum().backward()
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


class LayoutClock:
    """A fake clock: a forward in NHWC takes COSTS["channels_last"] s, else COSTS["contiguous"]."""

    def __init__(self, model: nn.Module, costs: dict[str, float]) -> None:
        self.weight = model.features[0].weight
        self.costs = costs
        self.now = 0.0

    def __call__(self) -> float:
        nhwc = not self.weight.is_contiguous() and self.weight.is_contiguous(memory_format=CL)
        self.now += self.costs["channels_last" if nhwc else "contiguous"]
        return self.now


@pytest.mark.skipif(torch.cuda.is_available(), reason="the measurement runs on CPU")
@pytest.mark.parametrize("winner", ["channels_last", "contiguous"])
@pytest.mark.usefixtures("fp32_auto")
def test_cpu_keeps_the_layout_measured_faster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, winner: str
) -> None:
    # an empty compile cache of its own: a cache set for the run would hand this test the
    # layout another test recorded there ("taken from this machine's record")
    monkeypatch.setenv("AUTOOPT_COMPILE_CACHE", str(tmp_path / "compile-cache"))
    torch.manual_seed(0)
    reference = SmallCNN()
    model = copy.deepcopy(reference)
    costs = {"channels_last": 0.002, "contiguous": 0.002, winner: 0.001}
    monkeypatch.setattr(cl_pass, "CLOCK", LayoutClock(model, costs))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    # compile=False: with a compile cache, compile joins the CPU trials and the layout is
    # decided later than these 8 steps
    model, opt = autoopt.optimize(model, optimizer=opt, compile=False, verbose=False)
    assert (
        "kept only if training steps measure faster than in NCHW"
        in autoopt.report(model)["channels_last"].detail
    )
    x, y = cnn_data(64)  # 8 steps: the trials take 4-6 of them
    train(model, opt, batches(x, y, 8), epochs=1)
    train(reference, ref_opt, batches(x, y, 8), epochs=1)
    result = autoopt.report(model)["channels_last"]
    # A step is read twice (its forward, its backward): twice the clock's cost per read.
    times = f"channels_last {costs['channels_last'] * 2000:g} ms ±0% ("
    assert times in result.detail, result.detail
    nhwc = model.features[0].weight.is_contiguous(memory_format=CL)
    assert nhwc == (winner == "channels_last")
    assert nhwc or model.features[0].weight.is_contiguous()
    assert result.status.value == ("applied" if nhwc else "skipped"), result.detail
    # The timed forwards left no trace: BatchNorm statistics, weights, train mode as eager's.
    assert model.training and model.features[1].training
    for mine, theirs in zip(
        model.state_dict().values(), reference.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("fp32_auto")
def test_an_explicit_true_or_a_compiled_forward_is_not_measured(monkeypatch) -> None:
    clock = LayoutClock(SmallCNN(), {"channels_last": 1.0, "contiguous": 0.001})
    monkeypatch.setattr(cl_pass, "CLOCK", clock)
    for kwargs in ({"channels_last": True}, {"compile": "jit"}):
        model = autoopt.optimize(SmallCNN(), verbose=False, **kwargs)
        model(torch.randn(2, 3, 16, 16))
        assert "measured" not in autoopt.report(model)["channels_last"].detail
    assert clock.now == 0.0


class DropoutCNN(SmallCNN):
    """SmallCNN with an `nn.Dropout` on its 4-D feature maps (SqueezeNet's, a U-Net's)."""

    def __init__(self) -> None:
        super().__init__()
        self.features.insert(3, nn.Dropout(0.3))


class FunctionalDropoutCNN(SmallCNN):
    """A dropout written in the forward (WideResNet's, DenseNet's `F.dropout`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.dropout(self.features(x), 0.3, self.training)
        return self.head(torch.flatten(h, 1))


class DropPathCNN(SmallCNN):
    """Draws that do not follow the layout: Dropout2d (one per channel), and stochastic depth
    drawn into a fresh `new_empty` tensor (timm's DropPath)."""

    def __init__(self) -> None:
        super().__init__()
        self.features.insert(3, nn.Dropout2d(0.3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        keep = h.new_empty((h.shape[0], 1, 1, 1)).bernoulli_(0.8)
        return self.head(torch.flatten(h * keep / 0.8, 1))


def _nchw_loop_and_optimized(
    model_class: type[nn.Module], **options: object
) -> tuple[list[float], list[float], nn.Module]:
    """Losses of the user's own NCHW fp32 loop and of the same model under optimize(), both
    from the same seed."""
    torch.manual_seed(0)
    reference = model_class()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False, **options
    )
    x, y = cnn_data(64)
    torch.manual_seed(1)
    got = train(model, optimizer, batches(x, y, 16), epochs=2)
    torch.manual_seed(1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    expected = train_by_hand(reference, ref_opt, batches(x, y, 16), 2)
    return got, expected, model


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("model_class", [DropoutCNN, DropPathCNN])
def test_dropout_draws_the_nchw_loops_masks(model_class: type[nn.Module], compiled: bool) -> None:
    """A mask is drawn in memory order: an `nn.Dropout` on NHWC activations would draw other
    masks than the user's NCHW loop at the same seed (every loss ~1e-3 apart)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got, expected, model = _nchw_loop_and_optimized(model_class, compile=compiled)
    assert not [w for w in seen if "NHWC" in str(w.message)]  # the draws are the user's
    result = autoopt.report(model)["channels_last"]
    assert result.status.value == "applied" and not result.events
    assert_same_training(got, expected, None)


def test_a_draw_written_in_the_forward_is_reported_with_a_warning() -> None:
    with pytest.warns(
        UserWarning, match=r"nn\.functional\.dropout\(\.\.\.\) in FunctionalDropoutCNN\.forward"
    ):
        got, expected, model = _nchw_loop_and_optimized(FunctionalDropoutCNN)
    (event,) = autoopt.report(model)["channels_last"].events
    assert event.kind == "random draw" and event.filename == __file__
    lines, start = inspect.getsourcelines(FunctionalDropoutCNN.forward)
    assert "functional.dropout" in lines[event.lineno - start]
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) > 1e-4  # what it warns of


def test_a_model_the_user_put_in_channels_last_keeps_its_own_masks() -> None:
    torch.manual_seed(0)
    reference = DropoutCNN().to(memory_format=CL)
    model = copy.deepcopy(reference)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    assert not model.features[3]._forward_pre_hooks
    x, y = cnn_data(64)
    torch.manual_seed(1)
    got = train(model, optimizer, batches(x, y, 16), epochs=2)
    torch.manual_seed(1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    expected = train_by_hand(reference, ref_opt, batches(x, y, 16), 2, channels_last=True)
    assert_same_training(got, expected, None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the measurement runs on CPU")
@pytest.mark.parametrize("winner", ["channels_last", "contiguous"])
@pytest.mark.usefixtures("fp32_auto")
def test_the_draws_are_reported_only_when_the_trials_keep_nhwc(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, winner: str
) -> None:
    monkeypatch.setenv("AUTOOPT_COMPILE_CACHE", str(tmp_path / "compile-cache"))  # (as above)
    model = FunctionalDropoutCNN()
    costs = {"channels_last": 0.002, "contiguous": 0.002, winner: 0.001}
    monkeypatch.setattr(cl_pass, "CLOCK", LayoutClock(model, costs))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model, opt = autoopt.optimize(model, optimizer=opt, compile=False, verbose=False)
        assert not autoopt.report(model)["channels_last"].events  # NCHW until the trials end
        x, y = cnn_data(64)
        train(model, opt, batches(x, y, 8), epochs=1)
    events = autoopt.report(model)["channels_last"].events
    told = [w for w in seen if "draws in the NHWC layout" in str(w.message)]
    assert (len(events), len(told)) == ((1, 1) if winner == "channels_last" else (0, 0))
