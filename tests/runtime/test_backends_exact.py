"""The backends pass, exactly: torch's global flags for each answer the GPU gives (faked at
torch.cuda, so both answers run on any machine), the rule that stands under torchrun, which step
implementations an optimizer may take, and the CPU timing's turns."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context, DistState
from autoopt.runtime.options import Options
from autoopt.runtime.passes import backends

from .models import MLP, batches, mlp_data, train

_cudnn = torch.backends.cudnn
_matmul = torch.backends.cuda.matmul


def _flags() -> dict[str, object]:
    return {
        "cudnn.deterministic": _cudnn.deterministic,
        "cudnn.benchmark": _cudnn.benchmark,
        "cudnn.allow_tf32": _cudnn.allow_tf32,
        "matmul.allow_tf32": _matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


# Not torch's defaults (cudnn.allow_tf32 is on by default), so that each flag the pass sets shows.
_START = {
    "cudnn.deterministic": False,
    "cudnn.benchmark": False,
    "cudnn.allow_tf32": False,
    "matmul.allow_tf32": False,
    "float32_matmul_precision": "highest",
}


def _set(flags: dict[str, object]) -> None:
    # The precision first: setting it also sets matmul.allow_tf32 (and the reverse).
    torch.set_float32_matmul_precision(str(flags["float32_matmul_precision"]))
    _matmul.allow_tf32 = flags["matmul.allow_tf32"]
    _cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    _cudnn.deterministic = flags["cudnn.deterministic"]
    _cudnn.benchmark = flags["cudnn.benchmark"]


@pytest.fixture
def torch_flags() -> Iterator[None]:
    """Start from `_START`; torch's global flags as they were afterwards."""
    saved = _flags()
    _set(_START)
    assert _flags() == _START
    yield
    _set(saved)


def _gpus(monkeypatch: pytest.MonkeyPatch, *capabilities: tuple[int, int]) -> None:
    """torch.cuda answers as a machine with these GPUs (compute capability per index) would."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(capabilities))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def capability(index: int | None = None) -> tuple[int, int]:
        return capabilities[0 if index is None else index]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)


def _run(
    device: torch.device | None,
    deterministic: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
    dist: DistState | None = None,
    model: nn.Module | None = None,
) -> tuple[Context, backends.PassResult]:
    model = model if model is not None else MLP()
    ctx = Context(Options(deterministic=deterministic), model, None, optimizer, device=device)
    ctx.dist = dist
    return ctx, backends.run(ctx)


def _undo(ctx: Context) -> None:
    for undo in reversed(ctx.undo):  # as pipeline.prepare does when a later pass fails
        undo()


def test_an_ampere_gpu_gets_benchmark_and_tf32_and_a_failure_puts_them_back(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None
) -> None:
    _gpus(monkeypatch, (8, 0))
    ctx, result = _run(torch.device("cuda"))
    assert _flags() == {
        "cudnn.deterministic": False,
        "cudnn.benchmark": True,
        "cudnn.allow_tf32": True,
        "matmul.allow_tf32": True,
        "float32_matmul_precision": "high",
    }
    assert result.status.value == "applied"
    assert result.detail == "cudnn.benchmark=True, TF32 matmul and convolutions; no optimizer given"
    _undo(ctx)
    assert _flags() == _START


def test_a_gpu_before_ampere_gets_benchmark_only(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None
) -> None:
    _gpus(monkeypatch, (7, 5))
    ctx, result = _run(torch.device("cuda"))
    assert _flags() == {**_START, "cudnn.benchmark": True}
    assert result.status.value == "applied"
    assert result.detail == (
        "cudnn.benchmark=True (no TF32 before compute capability 8.0); no optimizer given"
    )
    _undo(ctx)
    assert _flags() == _START


def test_the_flags_follow_the_gpu_the_model_is_on(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None
) -> None:
    """A machine with an Ampere card as cuda:0 and an older one as cuda:1."""
    _gpus(monkeypatch, (8, 6), (7, 0))
    _run(torch.device("cuda", 1))
    assert _flags() == {**_START, "cudnn.benchmark": True}
    _set(_START)
    _run(torch.device("cuda", 0))
    assert _flags()["matmul.allow_tf32"] is True


def test_deterministic_on_a_gpu_sets_cudnn_deterministic_and_no_tf32(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None
) -> None:
    _gpus(monkeypatch, (9, 0))
    _cudnn.benchmark = True  # the user's, turned off
    ctx, result = _run(torch.device("cuda"), deterministic=True)
    assert _flags() == {**_START, "cudnn.deterministic": True, "cudnn.benchmark": False}
    assert result.status.value == "applied"
    assert result.detail == (
        "deterministic=True: cudnn.deterministic=True, cudnn.benchmark=False, no TF32; "
        "no optimizer given"
    )
    _undo(ctx)
    assert _flags() == {**_START, "cudnn.benchmark": True}


def test_amp_false_on_a_gpu_sets_no_speed_flag(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None
) -> None:
    """amp=False keeps eager's fp32 kernels: no TF32, no convolution algorithms chosen by
    timing; the user's flags stay as they are."""
    _gpus(monkeypatch, (8, 0))
    ctx = Context(Options(amp=False), MLP(), None, None, device=torch.device("cuda"))
    result = backends.run(ctx)
    assert _flags() == _START and ctx.undo == []
    assert result.status.value == "skipped"
    assert result.detail == (
        "no cudnn.benchmark or TF32: amp=False keeps eager's fp32 kernels, and both change how "
        "fp32 rounds (TF32 matmuls, convolution algorithms chosen by timing); torch's flags "
        "stay as they are; no optimizer given"
    )


@pytest.mark.parametrize("device", [torch.device("cpu"), None], ids=["cpu", "unset"])
def test_no_flag_off_cuda_even_where_a_gpu_exists(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None, device: torch.device | None
) -> None:
    _gpus(monkeypatch, (8, 0))
    ctx, result = _run(device)
    assert _flags() == _START and ctx.undo == []
    assert result.status.value == "skipped"
    assert result.detail == "no cuDNN/TF32 flags on cpu; no optimizer given"


# --- the optimizer step: the rule under torchrun, and what each optimizer may take ------------


def _sgd() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = MLP()
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize(
    ("strategy", "make", "flags", "detail"),
    [
        ("ddp", "Adam", (True, False), "fused Adam step"),
        ("ddp", "RMSprop", (False, True), "foreach RMSprop step (no fused kernel for it here)"),
        ("fsdp", "Adam", (True, False), "fused Adam step"),
        (
            "fsdp",
            "SGD",
            (False, True),
            "foreach SGD step (its fused step has no DTensor rule for FSDP2)",
        ),
    ],
)
def test_under_torchrun_the_rule_stands_without_timing(
    strategy: str, make: str, flags: tuple[bool, bool], detail: str
) -> None:
    """Every rank must take the same step: no timing, the preferred step installed at once."""
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    optimizer = getattr(torch.optim, make)(model.parameters(), lr=0.01)
    dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo", strategy=strategy)
    ctx, result = _run(torch.device("cpu"), optimizer=optimizer, dist=dist, model=model)
    assert (result.name, result.status.value) == ("backends", "applied")
    assert result.detail == f"no cuDNN/TF32 flags on cpu; {detail}"
    assert ctx.step_layers == []
    assert all((g["fused"], g["foreach"]) == flags for g in optimizer.param_groups)
    assert getattr(optimizer, "_step_supports_amp_scaling", False) is flags[0]
    # The user's own flags in a checkpoint; loading one gives the rule's back.
    state = optimizer.state_dict()
    assert (state["param_groups"][0]["fused"], state["param_groups"][0]["foreach"]) == (
        None,
        None,
    )
    optimizer.load_state_dict(state)
    assert (optimizer.param_groups[0]["fused"], optimizer.param_groups[0]["foreach"]) == flags
    # The same training as the user's optimizer as it was.
    ref_opt = getattr(torch.optim, make)(reference.parameters(), lr=0.01)
    x, y = mlp_data(64)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    train(reference, ref_opt, batches(x, y, 16), epochs=1)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_the_candidates_and_the_reasons_each_optimizer_gets() -> None:
    cpu = torch.device("cpu")
    _, sgd = _sgd()
    # Without a `sharded` argument: not sharded, fused first.
    assert backends.choose_optimizer(sgd, cpu)[1] == "fused SGD step"
    assert list(backends.step_candidates(sgd, cpu)[0]) == ["fused", "foreach"]
    params = list(MLP().parameters())
    kept = {
        "fused=False": torch.optim.Adam(params, fused=False),
        "foreach=False": torch.optim.Adam(params, foreach=False),
    }
    for optimizer in kept.values():
        assert backends.choose_optimizer(optimizer, cpu) == (
            None,
            "Adam sets fused/foreach explicitly: kept",
        )
    differentiable = torch.optim.Adam(params, differentiable=True)
    assert backends.choose_optimizer(differentiable, cpu) == (
        None,
        "Adam is differentiable: kept the default step",
    )
    # An integer tensor among the parameters: neither kernel takes it.
    counter = nn.Parameter(torch.zeros(2, dtype=torch.long), requires_grad=False)
    mixed = torch.optim.Adam([*params, counter])
    assert backends.choose_optimizer(mixed, cpu) == (
        None,
        "Adam: no fused or foreach step available here",
    )


class StateClock:
    """A fake clock: a step of the current implementation takes COSTS[impl] s, and the step
    that creates the optimizer's state (its first) takes a second more."""

    def __init__(self, optimizer: torch.optim.Optimizer, costs: dict[str, float]) -> None:
        self.optimizer = optimizer
        self.costs = costs
        self.now = 0.0
        self.creating = False

    def __call__(self) -> float:
        group = self.optimizer.param_groups[0]
        impl = "fused" if group["fused"] else "foreach" if group["foreach"] else "default"
        if not self.optimizer.state:  # read before the first step
            self.creating = True
            return self.now
        self.now += self.costs[impl] + (1.0 if self.creating else 0.0)
        self.creating = False
        return self.now


def _timed(
    monkeypatch: pytest.MonkeyPatch, costs: dict[str, float]
) -> tuple[nn.Module, torch.optim.Optimizer, nn.Module, torch.optim.Optimizer]:
    """An SGD-with-momentum MLP under optimize() (CPU timing on a fake clock), and its
    untouched twin."""
    model, optimizer = _sgd()
    reference = copy.deepcopy(model)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    monkeypatch.setattr(backends, "CLOCK", StateClock(optimizer, costs))
    # amp="auto" in fp32 (the callers use `fp32_auto`): amp=False would leave the fused step
    # out (its updates round apart from SGD's own).
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, compile=False, verbose=False)
    return model, optimizer, reference, ref_opt


def _close(model: nn.Module, reference: nn.Module) -> None:
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.usefixtures("fp32_auto")
def test_the_first_step_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step that creates the state is slow for every implementation: timed, it would put
    the preferred (fused) one out of the running."""
    model, optimizer, _, _ = _timed(
        monkeypatch, {"fused": 0.001, "foreach": 0.0012, "default": 0.0013}
    )
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    detail = autoopt.report(model)["backends"].detail
    assert detail == (
        "no cuDNN/TF32 flags on cpu; fused SGD step (fused 1 ms ±0% (3 steps), foreach 1.2 ms "
        "±0% (3 steps), default 1.3 ms ±0% (3 steps), training steps 2-10): fused 30% faster "
        "(beyond the noise: ±0%, 3 rounds)"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.usefixtures("fp32_auto")
def test_a_step_the_users_options_rule_out_is_not_a_candidate() -> None:
    """A tensor learning rate: torch's foreach Adam refuses it, the fused one takes it. Probed
    with the user's options, foreach is never timed (its step would raise)."""
    torch.manual_seed(0)
    reference = MLP()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01))
    ref_opt = torch.optim.Adam(reference.parameters(), lr=torch.tensor(0.01))
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, compile=False, verbose=False)
    assert (
        "Adam step: timing fused, default on the first" in autoopt.report(model)["backends"].detail
    )
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    train(reference, ref_opt, batches(x, y, 16), epochs=1)
    _close(model, reference)


def _scaled_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, data: list, scaler: torch.amp.GradScaler
) -> None:
    for x, y in data:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.parametrize("winner", ["foreach", "default"])
@pytest.mark.usefixtures("fp32_auto")
def test_a_gradscaler_after_the_timing_gets_the_chosen_steps_own_path(
    monkeypatch: pytest.MonkeyPatch, winner: str
) -> None:
    """Once foreach or the default step won, the optimizer no longer says it unscales inside
    its step (only the fused one does): a GradScaler unscales first, and the updates are the
    user's optimizer's."""
    costs = {"fused": 0.0015, "foreach": 0.0016, "default": 0.0017, winner: 0.001}
    model, optimizer, reference, ref_opt = _timed(monkeypatch, costs)
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    train(reference, ref_opt, batches(x, y, 16), epochs=1)
    assert f"{winner} SGD step (" in autoopt.report(model)["backends"].detail
    assert not getattr(optimizer, "_step_supports_amp_scaling", False)
    data = list(batches(x, y, 16))[:3]
    _scaled_steps(model, optimizer, data, torch.amp.GradScaler("cpu"))
    _scaled_steps(reference, ref_opt, data, torch.amp.GradScaler("cpu"))
    _close(model, reference)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.usefixtures("fp32_auto")
def test_steps_through_a_gradscaler_or_with_a_closure_are_not_switched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GradScaler hands the fused step its scale (`grad_scale`): switching to another step
    then would apply scaled gradients. A closure step runs as called and returns its loss."""
    model, optimizer, reference, ref_opt = _timed(
        monkeypatch, {"fused": 0.003, "foreach": 0.001, "default": 0.002}
    )
    x, y = mlp_data(160)
    data = list(batches(x, y, 16))
    _scaled_steps(model, optimizer, data, torch.amp.GradScaler("cpu"))
    _scaled_steps(reference, ref_opt, data, torch.amp.GradScaler("cpu"))
    _close(model, reference)
    for step_x, step_y in data[:4]:

        def closure(m: nn.Module = model, a: torch.Tensor = step_x, b: torch.Tensor = step_y):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(a), b)
            loss.backward()
            return loss

        loss = optimizer.step(closure=closure)
        assert isinstance(loss, torch.Tensor) and loss.requires_grad
        ref_opt.step(lambda a=step_x, b=step_y: _ref_closure(reference, ref_opt, a, b))
    _close(model, reference)
    detail = autoopt.report(model)["backends"].detail
    assert "timing fused, foreach, default" in detail  # nothing timed yet


def _ref_closure(
    model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


@pytest.mark.parametrize("gpu", [True, False], ids=["ampere", "cpu"])
def test_an_optimizer_the_user_configured_is_kept_and_the_flags_still_apply(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None, gpu: bool
) -> None:
    if gpu:
        _gpus(monkeypatch, (8, 0))
    optimizer = torch.optim.Adam(MLP().parameters(), foreach=False)
    _, result = _run(torch.device("cuda" if gpu else "cpu"), optimizer=optimizer)
    flags = (
        "cudnn.benchmark=True, TF32 matmul and convolutions"
        if gpu
        else ("no cuDNN/TF32 flags on cpu")
    )
    assert (result.name, result.status.value, result.detail) == (
        "backends",
        "applied" if gpu else "skipped",
        f"{flags}; Adam sets fused/foreach explicitly: kept",
    )
    assert optimizer.param_groups[0]["foreach"] is False


class OwnScalingSGD(torch.optim.SGD):
    """A user's optimizer that tells GradScaler it takes the scale inside its step."""

    def __init__(
        self,
        params: object,
        lr: float = 0.1,
        momentum: float = 0.0,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        super().__init__(params, lr=lr, momentum=momentum, foreach=foreach, fused=fused)
        self._step_supports_amp_scaling = True


@pytest.mark.skipif(torch.cuda.is_available(), reason="the timing runs on CPU")
@pytest.mark.usefixtures("fp32_auto")
def test_the_users_own_step_attributes_come_back_when_their_step_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fused candidate sets `_step_supports_amp_scaling`; when the default step wins, the
    optimizer says again what its own class said."""
    torch.manual_seed(0)
    model = MLP()
    optimizer = OwnScalingSGD(model.parameters(), lr=0.1, momentum=0.9)
    costs = {"fused": 0.0015, "foreach": 0.0016, "default": 0.001}
    monkeypatch.setattr(backends, "CLOCK", StateClock(optimizer, costs))
    model, optimizer = autoopt.optimize(model, optimizer=optimizer, compile=False, verbose=False)
    x, y = mlp_data(160)
    train(model, optimizer, batches(x, y, 16), epochs=1)
    assert "default OwnScalingSGD step (" in autoopt.report(model)["backends"].detail
    assert optimizer.__dict__.get("_step_supports_amp_scaling") is True
    assert "_need_device_dtype_check_for_fused" not in optimizer.__dict__
