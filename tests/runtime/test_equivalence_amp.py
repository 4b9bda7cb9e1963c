"""amp="fp16" against the same loop written by hand with `torch.autocast` + `torch.amp.GradScaler`
(same init scale), from identical weights, for the gradient paths that do not run through
`forward`'s outputs. Tolerance: rtol 1e-4 / atol 1e-6 on parameters after a few SGD steps. Both
sides run the same fp16 forward and the same scaled backward; the only arithmetic difference is
where `1/scale` is applied (before accumulation here, after it in GradScaler), exact for a power
of two. A gradient off by the scale (65536x) or missing a term is off by orders of magnitude.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.scaling.loss_scaling import scaler_of

FP16 = {"amp": "fp16", "compile": False, "channels_last": False, "checkpoint": False}
ce = nn.functional.cross_entropy
Call = Callable[[torch.Tensor], torch.Tensor]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 4)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.enc(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(x))


def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen)


def _autocast(model: nn.Module) -> Call:
    """The hand-written side's forward: autocast, outputs back to fp32 (what amp= does)."""

    def call(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.float16):
            return model(x).float()

    return call


def _l2(model: nn.Module, call: Call, x: torch.Tensor, y: torch.Tensor, grad: Any) -> Any:
    return ce(call(x), y) + 1e-2 * sum(p.pow(2).sum() for p in model.parameters())


def _other_method(model: nn.Module, call: Call, x: torch.Tensor, y: torch.Tensor, grad: Any):
    return ce(call(x), y) + model.encode(x.flip(0)).pow(2).mean()


def _gradient_penalty(model: nn.Module, call: Call, x: torch.Tensor, y: torch.Tensor, grad):
    x_hat = x.clone().requires_grad_()
    (g,) = grad(call(x_hat).logsumexp(1).sum(), x_hat)
    return ce(call(x), y) + 10 * ((g.norm(2, dim=1) - 1) ** 2).mean()


def _plain(model: nn.Module, call: Call, x: torch.Tensor, y: torch.Tensor, grad: Any) -> Any:
    return ce(call(x), y)


def _grad_as_user_writes_it(out: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(out, x, create_graph=True)


def _grad_by_torch_recipe(scaler: torch.amp.GradScaler) -> Callable[..., Any]:
    """torch's AMP examples, "gradient penalty": scale the inner grad's seed, unscale results."""

    def grad(out: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scaled = torch.autograd.grad(scaler.scale(out), x, create_graph=True)
        return tuple(g * (1.0 / scaler.get_scale()) for g in scaled)

    return grad


def _pair(freeze_head: bool = False) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    plain = Net()
    if freeze_head:
        plain.head.requires_grad_(False)
    return plain, copy.deepcopy(plain)


def _assert_same(a: nn.Module, b: nn.Module, before: nn.Module) -> None:
    for p, q, r in zip(a.parameters(), b.parameters(), before.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
        assert not torch.equal(q, r)  # it did train


@pytest.mark.parametrize(
    "loss_of", [_plain, _l2, _other_method, _gradient_penalty], ids=lambda f: f.__name__[1:]
)
@pytest.mark.parametrize("backwards", [1, 2])
def test_fp16_equals_autocast_and_gradscaler(loss_of: Callable[..., Any], backwards: int) -> None:
    ours, hand = _pair()
    start = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(3):
        for micro in range(backwards):  # several backward calls per step
            x, y = _data(10 * step + micro)
            loss_of(ours, ours, x, y, _grad_as_user_writes_it).backward()
            scaler.scale(
                loss_of(hand, _autocast(hand), x, y, _grad_by_torch_recipe(scaler))
            ).backward()
        opt.step()
        opt.zero_grad()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    _assert_same(ours, hand, start)
    assert scaler_of(ours).scale == scaler.get_scale()  # same overflows, same skips


def test_params_unfrozen_after_optimize_are_scaled_once() -> None:
    ours, hand = _pair(freeze_head=True)
    start = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(3):
        if step == 1:
            ours.head.requires_grad_(True)
            hand.head.requires_grad_(True)
        x, y = _data(step)
        _plain(ours, ours, x, y, None).backward()
        scaler.scale(_plain(hand, _autocast(hand), x, y, None)).backward()
        opt.step()
        opt.zero_grad()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    _assert_same(ours, hand, start)


def test_injected_inf_skips_the_step_and_halves_the_scale_like_gradscaler() -> None:
    ours, hand = _pair()
    start = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(4):
        x, y = _data(step)
        if step == 1:
            x[0, 0] = float("inf")
        _l2(ours, ours, x, y, None).backward()
        scaler.scale(_l2(hand, _autocast(hand), x, y, None)).backward()
        opt.step()
        opt.zero_grad()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    _assert_same(ours, hand, start)
    assert scaler_of(ours).scale == scaler.get_scale() == 2.0**15
    assert scaler_of(ours).skipped_steps == 1


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def test_gan_with_two_models_and_two_optimizers() -> None:
    bce = nn.functional.binary_cross_entropy_with_logits
    torch.manual_seed(0)
    g_plain, d_plain = Generator(), nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    g_hand, d_hand = copy.deepcopy(g_plain), copy.deepcopy(d_plain)
    g_start, d_start = copy.deepcopy(g_plain), copy.deepcopy(d_plain)
    g, opt_g = autoopt.optimize(
        g_plain, optimizer=torch.optim.Adam(g_plain.parameters(), lr=1e-3), verbose=False, **FP16
    )
    d, opt_d = autoopt.optimize(
        d_plain, optimizer=torch.optim.Adam(d_plain.parameters(), lr=1e-3), verbose=False, **FP16
    )
    hand_g = torch.optim.Adam(g_hand.parameters(), lr=1e-3)
    hand_d = torch.optim.Adam(d_hand.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    ones, zeros = torch.ones(16, 1), torch.zeros(16, 1)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        real, z = torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)
        # ours
        opt_d.zero_grad()
        (bce(d(real), ones) + bce(d(g(z).detach()), zeros)).backward()
        opt_d.step()
        opt_g.zero_grad()
        bce(d(g(z)), ones).backward()
        opt_g.step()
        # by hand
        gc, dc = _autocast(g_hand), _autocast(d_hand)
        hand_d.zero_grad()
        scaler.scale(bce(dc(real), ones) + bce(dc(gc(z).detach()), zeros)).backward()
        scaler.step(hand_d)
        hand_g.zero_grad()
        scaler.scale(bce(dc(gc(z)), ones)).backward()
        scaler.step(hand_g)
        scaler.update()
    _assert_same(g, g_hand, g_start)
    _assert_same(d, d_hand, d_start)


def test_a_backward_that_reaches_no_optimized_model_is_untouched() -> None:
    ours, _ = _pair()
    autoopt.optimize(
        ours, optimizer=torch.optim.SGD(ours.parameters(), lr=0.1), verbose=False, **FP16
    )
    other = nn.Linear(3, 1)
    x = torch.randn(5, 3)
    other(x).sum().backward()
    torch.testing.assert_close(other.weight.grad, x.sum(0, keepdim=True))
    (w,) = torch.autograd.grad((ours.enc.weight * 3).sum(), ours.enc.weight)  # read at true scale
    torch.testing.assert_close(w, torch.full_like(w, 3.0))


def _user_amp_loop(
    model: nn.Module, opt: torch.optim.Optimizer, autocast: bool
) -> torch.amp.GradScaler:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(8):
        x, y = _data(step)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = ce(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return scaler


@pytest.mark.parametrize("autocast", [True, False], ids=["autocast+GradScaler", "GradScaler"])
def test_the_users_own_amp_makes_autoopt_stand_down(autocast: bool) -> None:
    ours, hand = _pair()
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    with pytest.warns(UserWarning, match="step aside"):
        scaler = _user_amp_loop(ours, opt, autocast)
    reference = _user_amp_loop(hand, torch.optim.SGD(hand.parameters(), lr=0.1), autocast)
    assert scaler.get_scale() == reference.get_scale() == 2.0**16  # no double scaling, no skips
    if autocast:  # the whole loop was the user's own AMP: identical
        for p, q in zip(ours.parameters(), hand.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    detail = autoopt.report(ours)["amp"].detail
    assert "stood down" in detail and ("autocast" if autocast else "GradScaler") in detail
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every step
        _user_amp_loop(ours, opt, autocast)


class Checkpointed(Net):
    """The user's own reentrant checkpointing: the engine runs a backward inside the backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.encode, x, use_reentrant=True)
        return self.head(h)


def test_reentrant_checkpointing_is_seeded_once() -> None:
    torch.manual_seed(0)
    ours = Checkpointed()
    hand, start = copy.deepcopy(ours), copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(3):
        x, y = _data(step)
        x.requires_grad_()  # reentrant checkpoint needs an input that requires grad
        _l2(ours, ours, x, y, None).backward()
        scaler.scale(_l2(hand, _autocast(hand), x.detach().requires_grad_(), y, None)).backward()
        opt.step()
        opt.zero_grad()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    _assert_same(ours, hand, start)


def test_retain_graph_and_a_second_backward_through_the_same_graph() -> None:
    ours, hand = _pair()
    start = copy.deepcopy(ours)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    ours, opt = autoopt.optimize(ours, optimizer=opt, verbose=False, **FP16)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(3):
        x, y = _data(step)
        out = ours(x)
        ce(out, y).backward(retain_graph=True)
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        out = _autocast(hand)(x)
        scaler.scale(ce(out, y)).backward(retain_graph=True)
        scaler.scale(out.pow(2).mean()).backward()
        scaler.step(hand_opt)
        scaler.update()
        hand_opt.zero_grad()
    _assert_same(ours, hand, start)
