"""`optimize()` is all or nothing: a bad argument is rejected before anything changes, a
failure later puts everything back, and calling it again works (no stacked hooks)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context

from .models import SmallCNN, batches, cnn_data, train

OPTIONS = {"amp": False, "channels_last": True, "accumulate": 2, "verbose": False}


def fingerprint(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Everything optimize() may change on the model and optimizer, in comparable form."""
    return {
        "module attrs": [sorted(m.__dict__) for m in model.modules()],
        "module hooks": [
            len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
            for m in model.modules()
        ],
        "params": [(id(p), p.stride(), p.device, p.dtype) for p in model.parameters()],
        "param hooks": [len(p._backward_hooks or {}) for p in model.parameters()],
        "buffers": [(id(b), b.stride()) for b in model.buffers()],
        "optimizer attrs": sorted(optimizer.__dict__),
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        "group params": [[id(p) for p in g["params"]] for g in optimizer.param_groups],
        "defaults": dict(optimizer.defaults),
        "optimizer hooks": [
            len(optimizer._optimizer_state_dict_post_hooks),
            len(optimizer._optimizer_load_state_dict_pre_hooks),
            len(optimizer._optimizer_load_state_dict_post_hooks),
        ],
        "cudnn": (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
    }


def pair() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = SmallCNN()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def assert_retry_trains_like_eager(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    reference, reference_opt = pair()
    x, y = cnn_data(32)
    data = batches(x, y, 8)
    model, loader, optimizer = autoopt.optimize(model, data, optimizer, **OPTIONS)
    losses = train(model, optimizer, loader, clip=None)
    # Eager accumulation over 2 micro-batches: loss / 2, one step per 2 batches.
    expected = []
    for i, (xb, yb) in enumerate(data):
        loss = nn.functional.cross_entropy(reference(xb), yb)
        (loss / 2).backward()
        expected.append(loss.item())
        if i % 2 == 1:
            reference_opt.step()
            reference_opt.zero_grad()
    # Tolerance: fp32 rounding of channels-last vs NCHW convolutions over 4 steps.
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-5)


def test_a_bad_loader_is_rejected_before_anything_changes() -> None:
    model, optimizer = pair()
    before = fingerprint(model, optimizer)
    with pytest.raises(TypeError, match="iterable of batches"):
        autoopt.optimize(model, 42, optimizer, **OPTIONS)
    assert fingerprint(model, optimizer) == before
    assert_retry_trains_like_eager(model, optimizer)


def test_a_failure_after_every_pass_ran_puts_everything_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(ctx: Context) -> None:
        raise RuntimeError("a pass that fails after the others changed things")

    from autoopt.runtime import pipeline  # here: test 1 also runs against the old layout

    model, optimizer = pair()
    before = fingerprint(model, optimizer)
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "PASSES", (*pipeline.PASSES, broken))
        with pytest.raises(RuntimeError, match="a pass that fails"):
            autoopt.optimize(model, [], optimizer, deterministic=True, **OPTIONS)
    assert fingerprint(model, optimizer) == before  # cudnn flags included
    assert_retry_trains_like_eager(model, optimizer)


def test_a_failure_in_the_install_puts_everything_back(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Context) -> None:
        raise RuntimeError("a finalizer that fails")

    def add_broken_finalizer(ctx: Context) -> None:
        ctx.finalizers.append(broken)

    from autoopt.runtime import pipeline

    model, optimizer = pair()
    reference = copy.deepcopy(model.state_dict())
    before = fingerprint(model, optimizer)
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "PASSES", (*pipeline.PASSES, add_broken_finalizer))
        with pytest.raises(RuntimeError, match="a finalizer that fails"):
            autoopt.optimize(model, [], optimizer, **OPTIONS)
    assert fingerprint(model, optimizer) == before
    for name, value in model.state_dict().items():
        assert torch.equal(value, reference[name])
    assert_retry_trains_like_eager(model, optimizer)


@pytest.mark.parametrize("options", [{"amp": "fp16"}, {"amp": False, "accumulate": 4}])
def test_a_failure_leaves_no_global_patch_and_no_scaled_backward(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    from autoopt.runtime import pipeline
    from autoopt.runtime.scaling import grad_scalers, root_scaling

    def broken(ctx: Context) -> None:
        raise RuntimeError("a finalizer that fails")

    def add_broken_finalizer(ctx: Context) -> None:
        ctx.finalizers.append(broken)

    grad_scalers.unwatch_grad_scalers()  # as in a fresh process: no earlier optimize() patched it
    clip_internal = torch.nn.utils.clip_grad._clip_grads_with_norm_
    engine = torch.autograd._engine_run_backward
    model, optimizer = pair()
    reference = copy.deepcopy(model)
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "PASSES", (*pipeline.PASSES, add_broken_finalizer))
        with pytest.raises(RuntimeError, match="a finalizer that fails"):
            autoopt.optimize(model, [], optimizer, verbose=False, **options)
    assert root_scaling.registration_of_params(model.parameters()) == []
    assert torch.amp.GradScaler.scale is grad_scalers._original_grad_scaler_scale
    assert torch.nn.utils.clip_grad._clip_grads_with_norm_ is clip_internal
    assert torch.autograd._engine_run_backward is engine
    x, _ = cnn_data(4)
    model(x).sum().backward()  # unscaled (no x65536, no 1/4)
    reference(x).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
