"""amp="fp16" with the user's own reentrant checkpointing (`use_reentrant=True`), against the same
loop written with `torch.autocast` + `torch.amp.GradScaler` (same init scale).

The loss has no term over the parameters, so the only gradients the layers before a checkpoint get
are the ones torch's `CheckpointFunction` passes back from its inner (reentrant) backward. A
gradient unscaled one time too many is off by the scale (65536x) per checkpoint; the per-layer
ratio of our `.grad` to GradScaler's unscaled gradient must be 1, at every depth.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import autoopt
from autoopt.runtime.scaling.loss_scaling import scaler_of

FP16 = {"amp": "fp16", "compile": False, "channels_last": False, "checkpoint": False}
SCALE = 2.0**10  # small enough that a second unscaling leaves a ratio, not a zero


class Chain(nn.Module):
    """input layer -> checkpointed block -> checkpointed block -> head."""

    def __init__(self, nested: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.block1 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.block2 = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)
        self.nested = nested

    def _both(self, h: torch.Tensor) -> torch.Tensor:
        h = checkpoint(self.block1, h, use_reentrant=True)  # a checkpoint inside a checkpoint
        return self.block2(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        if self.nested:
            h = checkpoint(self._both, h, use_reentrant=True)
        else:
            h = checkpoint(self.block1, h, use_reentrant=True)
            h = checkpoint(self.block2, h, use_reentrant=True)
        return self.head(h)


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(32, 8, generator=gen), torch.randint(0, 4, (32,), generator=gen)


@pytest.mark.parametrize("nested", [False, True], ids=["sequential", "nested"])
def test_every_layer_before_a_reentrant_checkpoint_gets_a_true_scale_gradient(
    nested: bool,
) -> None:
    torch.manual_seed(0)
    ours = Chain(nested)
    hand = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    scaler_of(ours).load_state_dict({"scale": SCALE, "growth_tracker": 0})
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    for step in range(3):
        x, y = _batch(step)
        nn.functional.cross_entropy(ours(x), y).backward()
        with torch.autocast("cpu", dtype=torch.float16):
            out = hand(x).float()
        scaler.scale(nn.functional.cross_entropy(out, y)).backward()
        scaler.unscale_(hand_opt)
        for (name, p), q in zip(ours.named_parameters(), hand.parameters(), strict=True):
            ratio = (p.grad.norm() / q.grad.norm()).item()
            assert ratio == pytest.approx(1.0, rel=1e-3), f"step {step}, {name}: ratio {ratio:g}"
        opt.step()
        opt.zero_grad()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    for p, q in zip(ours.parameters(), hand.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)


class HandCheckpoint(torch.autograd.Function):
    """A reentrant checkpoint written by hand (not torch's): autoopt cannot read which leaves of
    its inner backward are the copies whose gradients it hands back."""

    @staticmethod
    def forward(ctx: Any, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        ctx.block = block
        ctx.save_for_backward(x)
        ctx.autocast = torch.is_autocast_enabled("cpu")
        with torch.no_grad():
            return block(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (x,) = ctx.saved_tensors
        x = x.detach().requires_grad_()
        with torch.enable_grad(), torch.autocast("cpu", torch.float16, enabled=ctx.autocast):
            out = ctx.block(x)
        torch.autograd.backward(out, grad)
        return None, x.grad


class HandChain(Chain):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.head(HandCheckpoint.apply(self.block1, h))


def test_another_reentrant_backward_stands_fp16_down_with_a_warning() -> None:
    torch.manual_seed(0)
    ours = HandChain()
    hand = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    scaler_of(ours).load_state_dict({"scale": SCALE, "growth_tracker": 0})
    x, y = _batch(0)
    with pytest.warns(UserWarning, match="reentrant autograd.Function other than"):
        nn.functional.cross_entropy(ours(x), y).backward()
    assert (
        "stood down: a backward ran inside another backward" in autoopt.report(ours)["amp"].detail
    )
    # This step's gradients are still exact (the copy's were left scaled, as handed back) ...
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    with torch.autocast("cpu", dtype=torch.float16):
        out = hand(x).float()
    scaler.scale(nn.functional.cross_entropy(out, y)).backward()
    for (name, p), q in zip(ours.named_parameters(), hand.parameters(), strict=True):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad / SCALE, msg=name)
    # ... and from now on the model runs in fp32, as eager does.
    opt.step()
    eager = HandChain()
    eager.load_state_dict(ours.state_dict())
    x, _ = _batch(1)
    torch.testing.assert_close(ours(x), eager(x), rtol=0, atol=0)
