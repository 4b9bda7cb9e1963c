"""optimize(tune=True): measured choice, on-disk cache, rejection of diverging plans, and no
side effects on the user's model, optimizer, loader or RNGs."""

from __future__ import annotations

import json
import math
import random
import warnings

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime import hardware, tune
from autoopt.runtime.options import Options
from autoopt.runtime.trials import replay, timing
from autoopt.runtime.tune import measure


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
    with pytest.warns(UserWarning, match="largest: corrupt by 0.5"):
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
    with pytest.warns(UserWarning, match="one-shot iterator"):
        decision = tune.choose(_model(), iterator, None, OPTIONS)
    assert decision.result.status.value == "skipped"
    assert "one-shot iterator" in decision.result.detail
    assert len(list(iterator)) == len(batches)


class Stream(torch.utils.data.IterableDataset):
    """One shared stream (a socket, a queue, a file handle read as it goes): every iterator over
    the dataset takes its items from the same source."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(2)
        self.source = iter(
            [(torch.randn(16, generator=g), int(torch.randint(0, 4, (), generator=g)))
             for _ in range(n)]
        )  # fmt: skip

    def __iter__(self):
        return self.source


def test_never_takes_the_loops_batches_from_a_shared_stream():
    """optimize(tune=True) on an IterableDataset over one stream: the loop gets every batch (the
    bug: tune took 4 of 8), tuning stands down with a warning and a report line."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    loader = torch.utils.data.DataLoader(Stream(64), batch_size=8)
    with pytest.warns(UserWarning, match="tune=True stands down: .*IterableDataset"):
        model, loader, opt = autoopt.optimize(model, loader, opt, tune=True, verbose=False)
    assert len(list(loader)) == 8
    result = autoopt.report(model)["tune"]
    assert result.status.value == "skipped" and "stream" in result.detail


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


def test_a_gpu_with_native_bf16_measures_fp16_too(monkeypatch):
    """On CUDA with native bf16 both precisions are candidates (fp16 with its loss scaling);
    where "auto" picks fp16 (no native bf16) or nothing (a CPU without it), only that one."""
    from autoopt.runtime.passes import amp as amp_pass

    model = _model()
    cuda = torch.device("cuda")
    monkeypatch.setattr(tune.plans, "target_device", lambda options, model: cuda)
    monkeypatch.setattr(amp_pass, "choose", lambda *a: (torch.bfloat16, "native"))
    assert {p.amp for p in tune.candidate_plans(model, Options(verbose=False))} == {
        False,
        "bf16",
        "fp16",
    }
    monkeypatch.setattr(amp_pass, "choose", lambda *a: (torch.float16, "no native bf16"))
    assert {p.amp for p in tune.candidate_plans(model, Options(verbose=False))} == {False, "fp16"}
    cpu = torch.device("cpu")
    monkeypatch.setattr(tune.plans, "target_device", lambda options, model: cpu)
    monkeypatch.setattr(amp_pass, "choose", lambda *a: (torch.bfloat16, "AMX"))
    assert {p.amp for p in tune.candidate_plans(model, Options(verbose=False))} == {False, "bf16"}


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
    from autoopt.runtime.tune import NOISE_MARGIN, Measurement, Plan
    from autoopt.runtime.tune.decision import pick as _simplest_within_noise

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


class Numbers(torch.utils.data.Dataset):
    """Map-style, so a DataLoader over it can have workers."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((16,), float(i)), i % 4


LOADERS = {
    "seeded generator": lambda: torch.utils.data.DataLoader(
        Numbers(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)
    ),
    "sampler with its own generator": lambda: torch.utils.data.DataLoader(
        Numbers(),
        batch_size=4,
        sampler=torch.utils.data.RandomSampler(
            range(16), generator=torch.Generator().manual_seed(6)
        ),
    ),
    "global RNG": lambda: torch.utils.data.DataLoader(Numbers(), batch_size=4, shuffle=True),
    "persistent workers": lambda: torch.utils.data.DataLoader(
        Numbers(),
        batch_size=4,
        shuffle=True,
        generator=torch.Generator().manual_seed(5),
        num_workers=1,
        persistent_workers=True,
    ),
}


def _order(loader, epochs: int = 2) -> list[list[int]]:
    out = []
    for epoch in range(epochs):
        torch.manual_seed(10 + epoch)
        out.append([int(v) for x, _ in loader for v in x[:, 0]])
    return out


@pytest.mark.parametrize("kind", list(LOADERS))
def test_tuning_leaves_the_loaders_order_as_it_was(kind):
    expected = _order(LOADERS[kind]())
    loader = LOADERS[kind]()
    torch.manual_seed(0)
    decision = tune.choose(_model(), loader, None, OPTIONS, cache=False, steps=1, warmup=0)
    assert decision.result.status.value == "applied", decision.result.detail
    assert _order(loader) == expected


class Augmented(Numbers):
    """Augmentation drawn from Python's and numpy's RNGs, as many datasets do."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        import numpy as np

        x, y = super().__getitem__(i)
        return x + random.random() + float(np.random.rand()), y


def test_the_loops_python_and_numpy_draws_are_as_without_tuning():
    """Tuning draws batches, and the dataset draws from Python's and numpy's RNGs: they are put
    back, so the loop's first epoch is the one it would have been (red if tune leaves either
    advanced)."""
    import numpy as np

    def first_epoch(tuned: bool) -> list[torch.Tensor]:
        random.seed(3)
        np.random.seed(3)
        loader = torch.utils.data.DataLoader(Augmented(), batch_size=4)
        if tuned:
            tune.choose(_model(), loader, None, OPTIONS, cache=False, steps=1, warmup=0)
        return [x for x, _ in loader]

    for got, expected in zip(first_epoch(True), first_epoch(False), strict=True):
        assert torch.equal(got, expected)


@pytest.fixture
def fake_clock(monkeypatch):
    """Each timed step of a plan takes COSTS[plan label] seconds (default 10 ms) on a fake clock."""
    costs: dict[str, float] = {}
    now = [0.0]
    apply, step = tune.Plan.apply, measure.train_step

    def labelled_apply(self, model, batches, optimizer, options):
        model, batches, optimizer = apply(self, model, batches, optimizer, options)
        model._fake_label = self.label
        return model, batches, optimizer

    def timed_step(model, *args, **kwargs):
        now[0] += costs.get(model._fake_label, 0.010)
        return step(model, *args, **kwargs)

    monkeypatch.setattr(tune.Plan, "apply", labelled_apply)
    monkeypatch.setattr(measure, "train_step", timed_step)
    monkeypatch.setattr(measure.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: True)  # two plans on any CPU
    return costs


def test_the_default_plan_wins_unless_another_is_clearly_faster(fake_clock):
    model = _model()
    default = tune.default_plan(model, OPTIONS)
    assert default == tune.Plan(amp="bf16")  # what optimize() picks on a CPU with native bf16
    plans = tune.candidate_plans(model, OPTIONS)
    assert plans[0] == default and tune.REFERENCE in plans

    def run():
        return tune.choose(model, _batches(), None, OPTIONS, cache=False, steps=3, warmup=1)

    # All equal: the default plan, not the simpler fp32 eager.
    assert run().plan == default
    # fp32 eager measured 2% faster is within the noise margin: still the default plan.
    fake_clock["fp32"] = 0.010 * (1 - tune.NOISE_MARGIN / 1.5)
    decision = run()
    assert decision.plan == default and decision.options.amp == "bf16"
    assert "bf16 (default)" in decision.result.detail
    # fp32 eager 2% slower than the default: the simpler plan no longer wins when it is slower.
    fake_clock.clear()
    fake_clock["bf16"] = 0.010
    fake_clock["fp32"] = 0.0102
    assert run().plan == default
    # Clearly faster than the default: tuning picks it.
    fake_clock["fp32"] = 0.008
    assert run().plan == tune.REFERENCE


def test_the_default_plan_is_what_the_passes_choose(monkeypatch):
    from autoopt.runtime.passes import amp as amp_pass

    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    options = Options(compile="jit", verbose=False)
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: False)
    assert tune.default_plan(conv, options) == tune.Plan(False, "jit", True)
    monkeypatch.setattr(amp_pass, "choose", lambda *a: (torch.float16, "forced"))
    assert tune.default_plan(conv, options).amp == "fp16"


def test_the_default_plan_keeps_eager_kernels_under_amp_false(monkeypatch):
    """As optimize() does: compile and the layout left on "auto" stand down (on CUDA as well,
    where the rules would compile and convert), explicit ones stay."""
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    cuda = torch.device("cuda")
    monkeypatch.setattr(tune.plans, "target_device", lambda options, model: cuda)
    assert tune.default_plan(conv, Options(amp="bf16", verbose=False)).compile is True
    assert tune.default_plan(conv, Options(amp=False, verbose=False)) == tune.Plan(
        False, False, False
    )
    explicit = Options(amp=False, compile=True, channels_last=True, verbose=False)
    assert tune.default_plan(conv, explicit) == tune.Plan(False, True, True)


def test_a_plan_faster_by_median_but_not_step_for_step_keeps_the_default() -> None:
    from autoopt.runtime.tune import Measurement, Plan
    from autoopt.runtime.tune.decision import pick

    default, other = Plan(amp="bf16"), Plan()
    # Load came and went between rounds: the other plan's median is lower, but in each round
    # (steps run side by side) it was no faster than the default.
    base = Measurement("bf16", 12.0, steps_ms=[10.0, 12.0, 20.0, 20.0, 10.0])
    noisy = Measurement("fp32", 10.5, steps_ms=[10.5, 12.5, 20.5, 10.5, 10.0])
    picked = pick([(default, base), (other, noisy)], default)
    assert picked is not None and picked[0] == default
    # Faster in every round by more than the noise margin: it wins.
    clear = Measurement("fp32", 9.0, steps_ms=[9.0, 10.0, 16.0, 16.0, 8.0])
    picked = pick([(default, base), (other, clear)], default)
    assert picked is not None and picked[0] == other


def _t5() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
        num_heads=4, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return transformers.T5ForConditionalGeneration(config)


def _t5_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {
            "input_ids": torch.randint(1, 64, (4, 12), generator=g),
            "labels": torch.randint(1, 64, (4, 8), generator=g),
        }
        for _ in range(2)
    ]


def test_a_plan_is_accepted_on_t5_whose_attention_dropout_is_a_float() -> None:
    """transformers' T5 attention calls `F.dropout(p=self.dropout)` with a float attribute: left
    on, two eager runs disagreed by 0.3 and every plan was rejected."""
    model = _t5()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "rejected every plan" warning
        decision = tune.choose(
            model, _t5_batches(), opt, OPTIONS, candidates=[tune.Plan(), tune.Plan(amp="bf16")],
            cache=False, steps=1, warmup=1,
        )  # fmt: skip
    by_plan = {m.plan: m for m in decision.measurements}
    assert by_plan["bf16"].ok, by_plan["bf16"].status
    assert max(by_plan["bf16"].output_error, by_plan["bf16"].loss_error) < 0.02


def test_disable_dropout_switches_off_t5s_functional_dropout() -> None:
    model = _t5().train()
    measure.disable_dropout(model)
    batch = _t5_batches()[0]
    torch.manual_seed(1)
    first = model(**batch).logits
    torch.manual_seed(2)
    assert torch.equal(first, model(**batch).logits)


class Noisy(nn.Module):
    """Noise injection in training mode (no dropout anywhere): only the same RNG state makes two
    runs agree."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x + torch.randn_like(x) if self.training else x)


class SamePlan(tune.Plan):
    """Eager fp32 again under another name: any difference from the reference is randomness."""

    @property
    def label(self) -> str:
        return "same"


def test_candidates_are_compared_on_the_same_rng_stream() -> None:
    torch.manual_seed(0)
    decision = tune.choose(
        Noisy(), _batches(), None, OPTIONS, candidates=[tune.Plan(), SamePlan()],
        cache=False, steps=1, warmup=1,
    )  # fmt: skip
    same = next(m for m in decision.measurements if m.plan == "same")
    assert same.ok and same.output_error == 0 and same.loss_error == 0, same.status


_CALLS = [0]


class Drifting(nn.Module):
    """State outside torch's RNG that changes at every call: no two runs agree."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _CALLS[0] += 1
        return self.lin(x) * _CALLS[0]


def test_rejecting_every_plan_for_disagreement_warns_and_names_the_largest() -> None:
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"tune rejected every plan .*largest: same by"):
        decision = tune.choose(
            Drifting(), _batches(), None, OPTIONS, candidates=[tune.Plan(), SamePlan()],
            cache=False, steps=1, warmup=1,
        )  # fmt: skip
    assert decision.plan == tune.Plan()
    assert "tune rejected every plan" in decision.result.detail


_TRIAL_SEEN: list[bool] = []  # per forward of a plan's copy: whether it ran as a trial


class _Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _TRIAL_SEEN.append(replay.in_trial())
        return self.lin(x)


def test_plans_are_measured_inside_the_trial_mechanisms_scope() -> None:
    # One trial mechanism (autoopt.runtime.trials.choices): tune's steps on copies count as trials, so
    # nothing that measures at a first training step (the layout/amp trials, the checkpoint
    # planner) runs nested in them, and the user's model keeps its mode.
    _TRIAL_SEEN.clear()
    model = _Recorder()
    model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tune.choose(model, _batches(), opt, OPTIONS, cache=False, steps=2, warmup=1)
    assert _TRIAL_SEEN and all(_TRIAL_SEEN), _TRIAL_SEEN
    assert not replay.in_trial() and not model.training


SEEN_DROPOUT: list[float] = []


class RecordsDropout(nn.Module):
    """Records its dropout probability at every training forward (of any copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            SEEN_DROPOUT.append(self.drop.p)
        return self.drop(self.lin(x))


def test_plans_are_timed_with_the_models_dropout_on() -> None:
    """The first step (compared with eager fp32) runs without dropout; the warm-up and timed
    steps with it, as the loop will run: GPT-2's compiled plan timed without it measured 1.18x
    of eager, the loop then ran 0.94x."""
    SEEN_DROPOUT.clear()
    tune.choose(
        RecordsDropout(), _batches(), None, OPTIONS, candidates=[tune.Plan()], cache=False,
        steps=2, warmup=1,
    )  # fmt: skip
    # The one plan (eager fp32, the reference): a compared step, then warm-up and timed steps.
    assert SEEN_DROPOUT == [0.0, 0.3, 0.3, 0.3], SEEN_DROPOUT


def test_the_report_says_what_tuning_cost_and_when_it_repays(fake_clock) -> None:
    model = _model()
    fake_clock["fp32"] = 0.008  # fp32 eager 20% faster than the default plan (bf16), 10 ms
    decision = tune.choose(model, _batches(), None, OPTIONS, cache=False, steps=3, warmup=1)
    assert decision.plan == tune.REFERENCE
    figures = decision.result.figures
    assert figures["gain_s"] == pytest.approx(0.002)
    assert figures["payback_steps"] == math.ceil(figures["tune_cost_s"] / 0.002)
    assert figures["fp32_s"] == pytest.approx(0.008) and figures["bf16_samples"] == 3
    first = decision.result.detail.splitlines()[0]
    assert f"tuning took {timing.duration(figures['tune_cost_s'])} (compiles included)" in first
    assert f"repaid after {figures['payback_steps']} steps" in first, first
    # The default plan kept: its cost is not repaid by a faster step, and the line says so.
    fake_clock.clear()
    kept = tune.choose(model, _batches(), None, OPTIONS, cache=False, steps=3, warmup=1)
    assert "the default plan kept: not repaid by a faster step" in kept.result.detail


def test_a_gpu_measures_compiles_modes_cuda_graphs_only_for_one_shape(monkeypatch):
    """On CUDA tuning measures torch.compile's modes too: "max-autotune" always,
    "reduce-overhead" (CUDA graphs, one graph per shape) only when the batches drawn have one
    shape; a CPU measures neither."""
    model = _model()
    monkeypatch.setattr(tune.plans, "target_device", lambda options, model: torch.device("cuda"))
    compiles = {p.compile for p in tune.candidate_plans(model, Options(verbose=False), True)}
    assert compiles == {False, True, "max-autotune", "reduce-overhead"}
    compiles = {p.compile for p in tune.candidate_plans(model, Options(verbose=False), False)}
    assert compiles == {False, True, "max-autotune"}
    held = tune.candidate_plans(model, Options(compile="reduce-overhead", verbose=False), True)
    assert {p.compile for p in held} == {"reduce-overhead"}  # the user's mode is held
    monkeypatch.setattr(tune.plans, "target_device", lambda options, model: torch.device("cpu"))
    assert {p.compile for p in tune.candidate_plans(model, Options(), True)} == {False, True}


def test_one_shape_reads_every_tensor_of_every_batch():
    from autoopt.runtime.tune.batches import one_shape

    assert one_shape(_batches(3))
    ragged = [*_batches(2), (torch.randn(5, 16), torch.randint(0, 4, (5,)))]
    assert not one_shape(ragged)
    other_target = [*_batches(2), (torch.randn(8, 16), torch.randint(0, 4, (8, 1)))]
    assert not one_shape(other_target)
    assert not one_shape([*_batches(2), (torch.randn(8, 16), torch.zeros(8))])  # dtype


def test_a_mode_counts_as_more_change_than_the_default_compile():
    assert tune.plans.complexity(tune.Plan(compile="max-autotune")) > tune.plans.complexity(
        tune.Plan(compile=True)
    )
