"""Copies of an optimized model are independent working models: `copy.deepcopy` (EMA, SWA,
snapshots) and `swa_utils.AveragedModel` keep autoopt's layers; `torch.save`/`torch.load` (also
in a fresh process) gives the user's plain model."""

from __future__ import annotations

import copy
import inspect
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim import swa_utils

import autoopt
from autoopt.runtime.passes import compile as compile_pass

from .models import MLP, SmallCNN, batches, cnn_data

# Each case: a model, the options that give it several forward layers, and an input.
CASES: dict[str, tuple[type[nn.Module], dict[str, Any], tuple[int, ...]]] = {
    "cnn, channels_last": (SmallCNN, {"channels_last": True}, (4, 3, 16, 16)),
    "mlp, torch.compile": (MLP, {"compile": True}, (4, 16)),
    "mlp, jit": (MLP, {"compile": "jit"}, (4, 16)),
    "deep stack, checkpoint": (
        lambda: nn.Sequential(*[nn.Linear(16, 16) for _ in range(8)]),  # type: ignore[dict-item]
        {"checkpoint": 2},
        (4, 16),
    ),
    "mlp, bf16": (MLP, {"amp": "bf16"}, (4, 16)),
    "mlp, fp16": (MLP, {"amp": "fp16"}, (4, 16)),
    "cnn, accumulate=2": (SmallCNN, {"accumulate": 2}, (4, 3, 16, 16)),
}


@pytest.fixture(autouse=True)
def eager_compile_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile through dynamo with the eager backend: the same layer, no C++ toolchain."""
    monkeypatch.setattr(compile_pass, "BACKEND", "eager")


def optimized(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(optimized model, a plain copy of it made before optimize(), an input); the model has
    run a forward and backward, so compiled/scripted artifacts exist."""
    make, options, shape = CASES[name]
    torch.manual_seed(0)
    plain = make()
    model = copy.deepcopy(plain)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay plain's
    model, optimizer = autoopt.optimize(
        model, None, optimizer, **{"amp": False, "verbose": False, **options}
    )
    x = torch.randn(*shape)
    model(x).sum().backward()
    optimizer.step()  # mid-cycle under accumulate=2
    model.zero_grad()
    return model, plain, x


def plain_forward(name: str, plain: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`plain(x)` as the user writes it with torch's autocast for the case's amp option."""
    amp = CASES[name][1].get("amp", False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp)
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        return plain(x).float()


@pytest.mark.parametrize("name", CASES)
def test_a_deep_copy_computes_with_its_own_weights(name: str) -> None:
    model, plain, x = optimized(name)
    before = model(x).detach()
    twin = copy.deepcopy(model)
    torch.testing.assert_close(twin(x), before)  # a working copy
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
        for p in plain.parameters():
            p.mul_(0.5)
    # Tolerance: channels-last convolutions round differently from NCHW ones (fp32); autocast
    # runs the same ops as torch.autocast.
    torch.testing.assert_close(twin(x), plain_forward(name, plain, x), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model(x), before)  # the original is untouched
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    twin(x).sum().backward()  # the copy trains its own parameters only
    for p, grad in zip(model.parameters(), grads, strict=True):
        assert (p.grad is None) if grad is None else torch.equal(p.grad, grad)
    assert all(p.grad is not None for p in twin.parameters())
    twin.zero_grad()  # a copy is a plain model: its zero_grad acts, also copied mid-cycle
    assert all(p.grad is None for p in twin.parameters())


@pytest.mark.parametrize("name", CASES)
def test_torch_save_and_load_round_trip(name: str) -> None:
    """The file holds the user's plain model (tests/runtime/test_save_whole_model.py): loaded,
    it computes as the unoptimized model does (fp32, no autocast), with its own weights."""
    model, plain, x = optimized(name)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert "forward" not in vars(loaded)  # the class's forward
    plain.load_state_dict(model.state_dict())
    # Tolerance: channels-last convolutions round differently from NCHW ones (fp32).
    torch.testing.assert_close(loaded(x), plain(x), rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        next(loaded.parameters()).add_(1.0)
    assert not torch.allclose(loaded(x), plain(x))  # its own weights
    torch.testing.assert_close(model(x), plain_forward(name, plain, x), rtol=1e-4, atol=1e-5)


def test_torch_load_in_a_fresh_process(tmp_path: Path) -> None:
    """The file loads where autoopt is never imported, weights only, as a plain model."""
    model, plain, x = optimized("cnn, channels_last")
    plain.load_state_dict(model.state_dict())
    torch.save({"model": model, "x": x, "out": plain(x).detach()}, tmp_path / "model.pt")
    script = (
        "import sys, torch\n"
        f"from {SmallCNN.__module__} import SmallCNN\n"
        "from torch import nn\n"
        "allowed = [SmallCNN, nn.Sequential, nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d, "
        "nn.AdaptiveAvgPool2d, nn.Linear]\n"
        "with torch.serialization.safe_globals(allowed):\n"
        f"    saved = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=True)\n"
        "torch.testing.assert_close(saved['model'](saved['x']), saved['out'], "
        "rtol=1e-4, atol=1e-5)\n"
        "print(type(saved['model'].forward).__name__, 'autoopt' in sys.modules)\n"
    )
    # The model's class comes from this test package: make it importable there, as it was here.
    package_root = Path(__file__).parents[SmallCNN.__module__.count(".")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package_root), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "method False"  # the class's forward; autoopt never imported


def test_swa_averaged_model_averages_the_optimized_weights() -> None:
    torch.manual_seed(0)
    plain = SmallCNN()
    model = copy.deepcopy(plain)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, amp=False, channels_last=True, verbose=False
    )
    plain_avg, avg = swa_utils.AveragedModel(plain), swa_utils.AveragedModel(model)
    x, y = cnn_data(32)
    for m, opt, averaged in ((plain, plain_opt, plain_avg), (model, optimizer, avg)):
        for xb, yb in batches(x, y, 8):
            opt.zero_grad()
            nn.functional.cross_entropy(m(xb), yb).backward()
            opt.step()
            averaged.update_parameters(m)
    # Tolerance: fp32, channels-last vs NCHW rounding over 4 steps.
    for mine, theirs in zip(avg.parameters(), plain_avg.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    avg.eval()
    plain_avg.eval()
    torch.testing.assert_close(avg(x[:4]), plain_avg(x[:4]), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(avg(x[:4]), model.eval()(x[:4]))  # the average, not the live model


def test_the_forward_still_looks_like_the_users() -> None:
    model = autoopt.optimize(SmallCNN(), amp=False, channels_last=True, verbose=False)
    assert model.forward.__name__ == "forward"
    assert list(inspect.signature(model.forward).parameters) == ["x"]
    assert autoopt.runtime.forward.original_forward(model).__func__ is SmallCNN.forward


@pytest.mark.parametrize("name", ["mlp, fp16", "cnn, accumulate=2"])
def test_a_copy_is_for_evaluation_its_backward_is_plain(name: str) -> None:
    """A copy (EMA, snapshot) computes like the optimized model but is not trained by autoopt:
    its backward is not loss-scaled nor divided by N (no optimizer of its own is gated, so a
    scaled gradient would reach a plain step). Training one needs optimize() on a plain model."""
    from autoopt.runtime.scaling import root_scaling

    model, plain, x = optimized(name)
    twin = copy.deepcopy(model)
    assert root_scaling.registration_of_params(twin.parameters()) == []
    twin(x).sum().backward()
    plain_forward(name, plain, x).sum().backward()
    # Tolerance: channels-last rounding (fp32); fp16 autocast runs the same ops as torch's.
    for mine, theirs in zip(twin.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)
