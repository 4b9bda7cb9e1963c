"""Compiled steps draw eager's random numbers: a seeded run trains as the user's eager loop does
(Dropout, drop-path, `randn_like`), on its first run (empty caches: compile measured against
eager on the first training steps) and on the run after (the record and the compiled artifacts
of the first), and the global generator ends where eager's does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._inductor.compile_fx

import autoopt
from autoopt.runtime.passes import compile as compile_pass

from .models import RANDOM_MODELS, mlp_data

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU trials")


@pytest.fixture
def inductor_patches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Inductor's entry point replaced by one that records the config patches it was called
    with and runs the graph as it is (no C++ build)."""
    seen: list[dict[str, Any]] = []

    def compile_fx(gm: torch.fx.GraphModule, inputs: Any, **kwargs: Any) -> Any:
        seen.append(dict(kwargs.get("config_patches") or {}))
        return gm.forward

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", compile_fx)
    monkeypatch.setattr(compile_pass, "BACKEND", "inductor")
    torch._dynamo.reset()
    yield seen
    torch._dynamo.reset()


def test_autoopt_asks_inductor_for_eager_random_kernels_and_only_for_its_own_compiles(
    inductor_patches: list[dict[str, Any]],
) -> None:
    model = autoopt.optimize(RANDOM_MODELS["dropout"](), compile=True, amp=False, verbose=False)
    x, _ = mlp_data(8)
    model(x).sum().backward()
    assert inductor_patches and all(p.get("fallback_random") for p in inductor_patches)
    inductor_patches.clear()
    torch.compile(lambda t: torch.nn.functional.dropout(t, 0.5))(x)  # the user's own compile
    assert inductor_patches and not any(p.get("fallback_random") for p in inductor_patches)
    assert torch._inductor.config.fallback_random is False


def test_a_compile_mode_becomes_the_options_it_stands_for(
    inductor_patches: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_pass, "COMPILE_OPTIONS", {"mode": "max-autotune-no-cudagraphs"})
    model = autoopt.optimize(RANDOM_MODELS["dropout"](), compile=True, amp=False, verbose=False)
    model(mlp_data(8)[0]).sum().backward()
    assert inductor_patches[0]["max_autotune"] and inductor_patches[0]["fallback_random"]


def test_deterministic_keeps_eager_where_the_backend_draws_its_own_numbers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def backend(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        return gm.forward

    monkeypatch.setattr(compile_pass, "BACKEND", backend)
    model = autoopt.optimize(
        RANDOM_MODELS["dropout"](), compile=True, deterministic=True, verbose=False
    )
    result = autoopt.report(model)["compile"]
    assert result.status.value == "skipped" and "deterministic=True" in result.detail
    model = autoopt.optimize(RANDOM_MODELS["dropout"](), compile=True, verbose=False)
    assert "not eager's" in autoopt.report(model)["compile"].detail


# One process = one run of a seeded script: every model trained by the user's eager loop, then
# through optimize() (compile="auto": measured against eager on the first steps when the cache
# has no record; compiled steps measure faster on this fake clock, so the record says compiled
# and the next run compiles from the first step with the saved artifacts).
CHILD = """
import json, torch, autoopt
from autoopt.runtime import hardware
from autoopt.runtime.passes import compile as compile_pass
from autoopt.runtime.trials import choices as trials
from runtime.models import RANDOM_MODELS, batches, mlp_data

autos = []
made = compile_pass.AutoCompile.__init__
def init(self, *args):
    made(self, *args)
    autos.append(self)
compile_pass.AutoCompile.__init__ = init
now = [0.0]
def clock():
    now[0] += 0.5 if autos and autos[-1].compiled else 1.0
    return now[0]
trials.CLOCK = clock

hardware.cpu_supports_bf16 = lambda: False

def fit(build, options):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if options is not None:
        model, opt = autoopt.optimize(model, optimizer=opt, verbose=False, **options)
    x, y = mlp_data(64)
    torch.manual_seed(1)
    losses = []
    for _ in range(3):
        for xb, yb in batches(x, y, 16):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model, losses, [p.detach().clone() for p in model.parameters()], torch.get_rng_state()

out = {}
for name, build in RANDOM_MODELS.items():
    _, losses, params, rng = fit(build, None)
    # amp="auto" on a CPU without native bf16 (faked): fp32 with compile measured (amp=False
    # would keep eager's kernels and measure nothing)
    model, got, ours, our_rng = fit(build, {"amp": "auto"})
    out[name] = {
        "loss": max(abs(a - b) / abs(b) for a, b in zip(got, losses)),
        "params": max(float((a - b).norm() / b.norm()) for a, b in zip(ours, params)),
        "rng": bool(torch.equal(rng, our_rng)),
        "compile": autoopt.report(model)["compile"].detail,
    }
print(json.dumps(out))
"""


@pytest.mark.slow
def test_first_and_second_run_train_as_eager_with_inductor(tmp_path: Path) -> None:
    """Real inductor (C++ builds), empty caches, then warm ones. Red without eager random
    kernels in autoopt's compile: the compiled trial steps drew inductor's own numbers."""
    env = {**os.environ, "AUTOOPT_COMPILE_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # autoopt keeps torch's inside its own
    root = Path(__file__).resolve().parents[1]
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    # the first run measures compiled steps against eager (the trial), the second follows the record
    for run, words in zip(runs, ("torch.compile: eager", "compile cache hit"), strict=True):
        for name, got in run.items():
            assert words in got["compile"], (name, got["compile"])
            assert got["loss"] <= 1e-6 and got["params"] <= 1e-6, (name, got)
            assert got["rng"], f"{name}: the global generator ends elsewhere than eager's"
