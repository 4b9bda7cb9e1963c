"""The backends pass, exactly: torch's global flags for each answer the GPU gives (faked at
torch.cuda, so both answers run on any machine), the rule that stands under torchrun, which step
implementations an optimizer may take, and the CPU timing's turns."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from autoopt.runtime.context import Context, DistState
from autoopt.runtime.options import Options
from autoopt.runtime.passes import backends

from .models import MLP

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
) -> tuple[Context, backends.PassResult]:
    model = MLP()
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


@pytest.mark.parametrize("device", [torch.device("cpu"), None], ids=["cpu", "unset"])
def test_no_flag_off_cuda_even_where_a_gpu_exists(
    monkeypatch: pytest.MonkeyPatch, torch_flags: None, device: torch.device | None
) -> None:
    _gpus(monkeypatch, (8, 0))
    ctx, result = _run(device)
    assert _flags() == _START and ctx.undo == []
    assert result.status.value == "skipped"
    assert result.detail == "no cuDNN/TF32 flags on cpu; no optimizer given"
