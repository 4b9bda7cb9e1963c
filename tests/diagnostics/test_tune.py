"""optimize(tune=True): measured choice, on-disk cache, rejection of diverging plans, and no
side effects on the user's model, optimizer, loader or RNGs."""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import tune
from autoopt.runtime.options import Options


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)
    )


def _batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)
    ]


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tune.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


# compile=False keeps the search space small and the test fast (no inductor compilation).
OPTIONS = Options(tune=True, compile=False, verbose=False)


def test_picks_a_plan_and_caches_it(cache_dir):
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    first = tune.choose(model, _batches(), opt, OPTIONS, steps=2, warmup=1)
    assert not first.cache_hit
    assert first.plan in tune.candidate_plans(model, OPTIONS)
    assert first.result.status.value == "applied"
    for m in first.measurements:  # every candidate timed, and shown in the report's table
        assert m.ok, m.status
        assert m.ms_per_step is not None and m.ms_per_step > 0
        assert m.plan in first.result.detail
    # The chosen values replace "auto"; the options the user set are held.
    assert first.options.amp == first.plan.amp and first.options.compile is False
    stored = json.loads((cache_dir / tune.CACHE_FILE).read_text())
    assert [e["plan"] for e in stored["entries"].values()] == [first.plan.label]

    second = tune.choose(model, _batches(), opt, OPTIONS, steps=2, warmup=1)
    assert second.cache_hit
    assert second.plan == first.plan and second.options == first.options
    assert "cached" in second.result.detail

    # Another input signature is another decision, measured afresh.
    wider = [(x.repeat(2, 1), y.repeat(2)) for x, y in _batches()]
    assert not tune.choose(model, wider, opt, OPTIONS, steps=1, warmup=1).cache_hit


class CorruptPlan(tune.Plan):
    """A candidate whose outputs are wrong (and which is made as fast as it can be)."""

    @property
    def label(self) -> str:
        return "corrupt"

    def apply(self, model, batches, optimizer, options):
        model, batches, optimizer = super().apply(model, batches, optimizer, options)
        model.register_forward_hook(lambda mod, args, out: out * 1.5)
        return model, batches, optimizer


def test_rejects_a_plan_whose_outputs_diverge():
    model = _model()
    decision = tune.choose(
        model,
        _batches(),
        None,
        OPTIONS,
        candidates=[tune.Plan(), CorruptPlan()],
        cache=False,
        steps=2,
        warmup=1,
    )
    by_plan = {m.plan: m for m in decision.measurements}
    assert by_plan["corrupt"].status.startswith("rejected: differs from fp32 eager")
    assert by_plan["corrupt"].output_error == pytest.approx(0.5, rel=1e-3)
    assert decision.plan == tune.Plan()
    assert not decision.cache_hit


def test_rejects_a_plan_that_fails():
    class Broken(tune.Plan):
        @property
        def label(self) -> str:
            return "broken"

        def apply(self, model, batches, optimizer, options):
            raise RuntimeError("this plan cannot be built")

    decision = tune.choose(
        _model(), _batches(), None, OPTIONS, candidates=[Broken()], cache=False, steps=1
    )
    # The only candidate failed: the user's options come back unchanged, the report says why.
    assert decision.options == OPTIONS
    assert decision.result.status.value == "failed"
    assert "this plan cannot be built" in decision.result.detail


def test_never_advances_the_users_state():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # the optimizer has state (exp_avg, step) that tuning must not move
    before_model = {k: v.clone() for k, v in model.state_dict().items()}
    before_opt = opt.state_dict()
    before_opt_state = {
        k: {n: t.clone() for n, t in s.items()} for k, s in before_opt["state"].items()
    }
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,))),
        batch_size=8,
        shuffle=True,
    )
    torch_rng, py_rng = torch.get_rng_state(), random.getstate()

    decision = tune.choose(model, loader, opt, OPTIONS, cache=False, steps=2, warmup=1)

    assert decision.result.status.value == "applied"
    for k, v in model.state_dict().items():  # weights and BatchNorm running stats
        assert torch.equal(v, before_model[k]), k
    after = opt.state_dict()
    assert after["param_groups"] == before_opt["param_groups"]
    for k, s in after["state"].items():
        for n, t in s.items():
            assert torch.equal(t, before_opt_state[k][n]), (k, n)
    # The RNGs are as they were, so the loader's first shuffled epoch is unchanged.
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert random.getstate() == py_rng
    assert model.training and all(p.grad is not None for p in model.parameters())


def test_does_not_consume_a_one_shot_iterator():
    batches = _batches()
    iterator = iter(batches)
    decision = tune.choose(_model(), iterator, None, OPTIONS)
    assert decision.result.status.value == "skipped"
    assert "one-shot iterator" in decision.result.detail
    assert len(list(iterator)) == len(batches)


def test_no_loader_is_a_skip_not_an_error():
    decision = tune.choose(_model(), None, None, OPTIONS)
    assert decision.result.status.value == "skipped"
    assert decision.options == OPTIONS


def test_candidates_search_only_auto_options():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
    plans = tune.candidate_plans(model, Options(amp=False, compile="auto"))
    assert {p.amp for p in plans} == {False}
    assert {p.compile for p in plans} == {False, True}
    assert {p.channels_last for p in plans} == {False, True}  # a conv model
    assert {p.channels_last for p in tune.candidate_plans(_model(), Options())} == {False}


def test_inferred_loss():
    logits = torch.randn(2, 5, 7)
    tokens = torch.randint(0, 7, (2, 5))
    expected = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    assert torch.allclose(tune.infer_loss(logits, tokens), expected)
    out, target = torch.randn(3, 4), torch.randn(3, 4)
    assert torch.allclose(tune.infer_loss(out, target), nn.functional.mse_loss(out, target))
    assert torch.allclose(tune.infer_loss({"loss": torch.tensor(2.0)}, None), torch.tensor(2.0))
    assert torch.allclose(tune.infer_loss((out,), None), out.square().mean())


def test_optimize_reports_the_tuning():
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    model, loader, opt = autoopt.optimize(
        model, _batches(), opt, tune=True, compile=False, verbose=False
    )
    result = autoopt.report(model)["tune"]
    assert result.status.value == "applied"
    assert "ms/step" in result.detail  # the table of measured candidates


def test_a_simpler_plan_within_the_noise_margin_wins() -> None:
    from autoopt.runtime.tune import NOISE_MARGIN, Measurement, Plan, _simplest_within_noise

    eager, bf16, compiled = Plan(), Plan(amp="bf16"), Plan(amp="bf16", compile=True)
    close = 10.0 * (1 + NOISE_MARGIN / 2)
    picked = _simplest_within_noise(
        [
            (eager, Measurement("fp32", 20.0)),
            (bf16, Measurement("bf16", close)),
            (compiled, Measurement("bf16+compile", 10.0)),
        ]
    )
    assert picked is not None and picked[0] == bf16
    clear_win = _simplest_within_noise(
        [(bf16, Measurement("bf16", 12.0)), (compiled, Measurement("bf16+compile", 10.0))]
    )
    assert clear_win is not None and clear_win[0] == compiled
