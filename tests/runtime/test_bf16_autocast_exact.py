"""amp="bf16" against the user's own loop under `torch.autocast("cpu", dtype=torch.bfloat16)`
(bf16 needs no GradScaler): same seed, weights and batches, a model with Dropout (and
drop-path, `randn_like`), the loss computed outside the model as a user writes it. bf16 rounding
amplifies any difference (a changed dropout mask, an op run in another dtype), so the reference
is the user's autocast loop bit for bit, not a tolerance around eager fp32. Red when autoopt's
random numbers differ from eager's (a dropout mask drawn apart, a trial step that consumes the
generator) or when its autocast region computes other ops in bf16 than torch.autocast does
(another dtype, outputs left in bf16 for the loss, part of the forward outside autocast).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._inductor.compile_fx
from torch import nn

import autoopt
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.trials import choices as trials

from .models import RANDOM_MODELS, batches, mlp_data

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU autocast reference")

Run = tuple[list[float], list[torch.Tensor], torch.Tensor]


def fit(build: Callable[[], nn.Module], options: dict[str, Any] | None) -> Run:
    """Two epochs of the user's loop: under the user's own bf16 autocast (options None), or
    through optimize(**options) with no autocast in the loop. Losses, parameters and the global
    generator's final state."""
    torch.manual_seed(0)
    model = build()
    # Plain SGD: its fused, foreach and default steps update bit for bit alike, so the step
    # kernel autoopt's timing picks (a separate choice: fused AdamW rounds 1 ulp apart) does
    # not blur what is tested here.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if options is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, opt = autoopt.optimize(model, optimizer=opt, verbose=False, **options)
    x, y = mlp_data(64)
    torch.manual_seed(1)  # what Dropout, drop-path and randn_like draw from
    losses = []
    for _ in range(2):
        for xb, yb in batches(x, y, 16):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=options is None):
                loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()


def assert_same(ours: Run, reference: Run) -> None:
    """Bit for bit: losses, parameters and where the generator ends."""
    assert ours[0] == reference[0], "losses differ from the user's autocast loop"
    for a, b in zip(ours[1], reference[1], strict=True):
        assert torch.equal(a, b), float((a - b).abs().max())
    assert torch.equal(ours[2], reference[2]), "the global generator ends elsewhere than eager's"


@pytest.mark.parametrize("name", list(RANDOM_MODELS))
def test_bf16_trains_as_the_users_autocast_loop(name: str) -> None:
    """Explicit amp="bf16" (compile off: the compiled case is below)."""
    build = RANDOM_MODELS[name]
    reference = fit(build, None)
    eager_fp32 = fit(build, {"amp": False})
    assert eager_fp32[0] != reference[0]  # bf16 is really on in the reference
    assert_same(fit(build, {"amp": "bf16", "compile": False}), reference)


@pytest.fixture
def inductor_as_eager(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Inductor's entry point replaced by one that records its config patches and runs the
    traced graph as it is (no C++ build), and a clock on which compiled steps are faster: the
    compile trial runs on the first training steps and keeps compile."""
    seen: list[dict[str, Any]] = []

    def compile_fx(gm: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        seen.append(dict(kwargs.get("config_patches") or {}))
        return gm.forward

    autos: list[Any] = []
    made = compile_pass.AutoCompile.__init__

    def init(self: Any, *args: Any) -> None:
        made(self, *args)
        autos.append(self)

    now = [0.0]

    def clock() -> float:
        now[0] += 0.5 if autos and autos[-1].compiled else 1.0
        return now[0]

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", compile_fx)
    monkeypatch.setattr(compile_pass, "BACKEND", "inductor")
    monkeypatch.setattr(compile_pass.AutoCompile, "__init__", init)
    monkeypatch.setattr(trials, "CLOCK", clock)
    torch._dynamo.reset()
    yield seen
    torch._dynamo.reset()


def test_bf16_with_the_compile_trial_trains_as_the_users_autocast_loop(
    inductor_as_eager: list[dict[str, Any]], tmp_path: Any
) -> None:
    """The default plan with amp="bf16" on CPU: compile measured on the first training steps
    (an empty compile cache), compiled steps kept. The trial's steps are training steps and
    draw eager's random numbers; autoopt's compile asks Inductor for eager's random kernels in
    bf16 as in fp32."""
    build = RANDOM_MODELS["dropout"]
    reference = fit(build, None)
    ours = fit(build, {"amp": "bf16", "compile_cache": str(tmp_path)})
    assert inductor_as_eager and all(p.get("fallback_random") for p in inductor_as_eager)
    assert_same(ours, reference)
