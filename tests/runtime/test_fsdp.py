"""distributed="fsdp": a real two-process FSDP2 run (gloo, torchrun) against one process on the
global batch, full state dicts, resume, bf16 against torch's own FSDP2 loop; and the decisions
(strategy, shard units, fp16 standing down) in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import autoopt
from autoopt.runtime.context import Context, DistState
from autoopt.runtime.distributed.fsdp import shard_blocks
from autoopt.runtime.memory import StepMemory, state_memory
from autoopt.runtime.options import Options
from autoopt.runtime.passes import amp, distributed
from autoopt.runtime.passes.distributed import DistributedSetupError, choose_strategy
from autoopt.runtime.report import Status

from .torchrun import TORCHRUN_ENV, load_worker, run_two_processes

WORKER = Path(__file__).with_name("fsdp_worker.py")


worker = load_worker(WORKER)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("fsdp")
    return out, run_two_processes(WORKER, out)


def _one_process(steps: int) -> tuple[nn.Module, list[float], torch.optim.Optimizer]:
    """The same training in one plain process on the global batch: torch only."""
    model = worker.make_model(seed=0)
    opt = worker.make_optimizer(model)
    data = torch.utils.data.DataLoader(worker.make_data(), batch_size=worker.GLOBAL_BATCH)
    losses: list[float] = []
    while len(losses) < steps:
        for x, y in data:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model, losses, opt


def _assert_state_close(saved: dict[str, torch.Tensor], model: nn.Module) -> None:
    plain = worker.make_model(seed=123)
    plain.load_state_dict(saved)  # strict: exactly the original keys
    for name, value in model.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[name], value, rtol=1e-5, atol=1e-6)


# ---- the two-process run ----------------------------------------------------------------------


@pytest.mark.slow
def test_two_ranks_train_to_the_one_process_loss(run: tuple[Path, list[dict[str, Any]]]) -> None:
    _out, results = run
    _model, expected, _ = _one_process(worker.STEPS)
    for result in results:
        train = result["train"]
        assert train["loader_len"] == worker.STEPS  # each rank iterates its half
        torch.testing.assert_close(train["losses"], expected, rtol=1e-5, atol=0)
        assert train["same_object"]  # sharded in place: the user's model object comes back
    report = {e["pass"]: e for e in results[0]["train"]["report"]}
    assert report["distributed"]["status"] == "applied"
    assert "FSDP2 over 2 processes" in report["distributed"]["detail"]
    assert "5 shard units (4 blocks + the root)" in report["distributed"]["detail"]
    assert "DistributedSampler" in report["loader"]["detail"]


@pytest.mark.slow
def test_each_rank_holds_about_half_the_parameter_and_optimizer_bytes(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    model, _, opt = _one_process(1)  # stepped: AdamW's real state
    full = state_memory(model, opt)
    full_params, full_state = full.parameters, full.optimizer_state
    per_rank = [r["train"] for r in results]
    assert sum(r["param_bytes"] for r in per_rank) == full_params  # the shards add up
    for r in per_rank:
        assert 0.45 < r["param_bytes"] / full_params < 0.55
        assert 0.45 < r["optimizer_bytes"] / full_state < 0.55
    detail = {e["pass"]: e for e in results[0]["train"]["report"]}["distributed"]["detail"]
    assert "per rank before: parameters" in detail and "after: parameters" in detail


@pytest.mark.slow
def test_full_state_dict_on_rank0_loads_into_the_plain_model(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    out, results = run
    model, _, _ = _one_process(worker.STEPS)
    saved = torch.load(out / "model.pt")
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in saved.values())
    assert results[0]["train"]["full_keys"] == sorted(model.state_dict())
    assert results[1]["train"]["full_keys"] == []  # only rank 0 gets the full copy
    _assert_state_close(saved, model)


@pytest.mark.slow
def test_resume_from_the_full_state_dicts_continues_the_same_run(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    out, results = run
    model, expected, _ = _one_process(2 * worker.STEPS)
    for result in results:
        # AdamW's step counts came back too, else its bias correction would differ.
        torch.testing.assert_close(
            result["resume"]["losses"], expected[worker.STEPS :], rtol=1e-5, atol=0
        )
    _assert_state_close(torch.load(out / "resumed.pt"), model)


@pytest.mark.slow
def test_bf16_under_fsdp_equals_torchs_own_fsdp2_mixed_precision_loop(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    for result in results:
        torch.testing.assert_close(
            result["amp"]["ours"], result["amp"]["theirs"], rtol=1e-6, atol=0
        )
        assert result["amp"]["max_state_diff"] < 1e-6
    _model, fp32, _ = _one_process(worker.STEPS)
    assert results[0]["amp"]["ours"] != fp32  # bf16 did compute in bf16
    report = {e["pass"]: e for e in results[0]["amp"]["report"]}
    assert "MixedPrecisionPolicy" in report["amp"]["detail"]
    assert "compile and channels_last off under FSDP2" in report["distributed"]["detail"]
    assert report["compile"]["status"] == report["channels_last"]["status"] == "skipped"


@pytest.mark.slow
def test_auto_shards_only_when_the_state_exceeds_the_budget(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    chosen = results[0]["auto"]
    assert chosen["below"]["type"] == "FSDPTiny"  # fully_shard's subclass of the user's class
    assert "exceed the memory budget" in chosen["below"]["detail"]
    assert chosen["above"]["type"] == "AutooptDDP"
    assert "fit the memory budget" in chosen["above"]["detail"]


@pytest.mark.slow
def test_accumulate_under_fsdp_steps_on_the_mean_of_the_micro_batches(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    # One process: each optimizer step sees the 2 ranks x ACCUMULATE micro-batches at once.
    model = worker.make_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = worker.GLOBAL_BATCH * worker.ACCUMULATE
    for x, y in torch.utils.data.DataLoader(worker.make_data(), batch_size=batch):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    saved = {k: torch.tensor(v) for k, v in results[0]["accumulate"]["state"].items()}
    _assert_state_close(saved, model)
    report = {e["pass"]: e for e in results[0]["accumulate"]["report"]}
    assert "reduce-scattered on the last micro-batch only" in report["distributed"]["detail"]
    assert "FSDP reduce-scatters on the last micro-batch only" in report["accumulate"]["detail"]


@pytest.mark.slow
def test_checkpointing_under_fsdp_keeps_the_one_process_result(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    model = worker.make_deep()
    opt = worker.make_optimizer(model)
    for x, y in torch.utils.data.DataLoader(worker.make_data(), batch_size=worker.GLOBAL_BATCH):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for name, value in model.state_dict().items():
        saved = torch.tensor(results[0]["checkpoint"]["state"][name])
        torch.testing.assert_close(saved, value, rtol=1e-5, atol=1e-6)
    report = {e["pass"]: e for e in results[0]["checkpoint"]["report"]}
    assert report["checkpoint"]["status"] == "applied"
    assert "9 shard units (8 blocks + the root)" in report["distributed"]["detail"]


@pytest.mark.slow
def test_checkpoint_auto_under_fsdp_plans_with_the_sharded_state(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    _out, results = run
    model, _, _ = _one_process(worker.STEPS)
    for name, value in model.state_dict().items():
        saved = torch.tensor(results[0]["plan"]["state"][name])
        torch.testing.assert_close(saved, value, rtol=1e-5, atol=1e-6)
    for result in results:
        planned = result["plan"]
        memory = planned["memory"]
        assert memory["budget"] == 1
        assert memory["before"]["parameters"] == planned["full_param_bytes"]  # unsharded
        # The checkpoint plan counted this rank's shard, as the memory section's "after" does.
        assert memory["after"]["parameters"] == planned["param_bytes"]
        assert planned["planned_parameters"] == planned["param_bytes"]
        assert 0 < memory["after"]["activations"] < memory["before"]["activations"]
        report = {e["pass"]: e for e in planned["report"]}
        assert report["checkpoint"]["status"] == "applied"
        assert "still exceeds the budget" in report["checkpoint"]["detail"]


# ---- decisions, in-process --------------------------------------------------------------------


def test_choose_strategy() -> None:
    memory = StepMemory(parameters=100, gradients=100, optimizer_state=200)
    assert choose_strategy("fsdp", memory, None)[0] == "fsdp"
    assert choose_strategy("ddp", memory, 1)[0] == "ddp"  # asked for: the budget is not read
    assert choose_strategy("auto", memory, None) == (
        "ddp",
        "parameters + gradients + optimizer state 400 B, no memory budget",
    )
    assert choose_strategy(True, memory, 399)[0] == "fsdp"
    assert choose_strategy("auto", memory, 400)[0] == "ddp"


@pytest.mark.parametrize("option", ["ddp", "fsdp"])
def test_ddp_or_fsdp_without_torchrun_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    ctx = Context(Options(distributed=option), nn.Linear(2, 2), None, None)
    with pytest.raises(DistributedSetupError, match=rf"distributed='{option}'\) needs a multi"):
        distributed.run(ctx)


class Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))  # inside a block: not a unit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convs(x)


def test_shard_blocks_takes_the_outermost_same_class_stacks() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList(Stage() for _ in range(3))
    model.mixed = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))  # not one class
    model.single = nn.ModuleList([Stage()])  # one child is no stack; its own layers are
    model.empty = nn.Sequential(nn.Sequential(nn.ReLU()), nn.Sequential(nn.ReLU()))  # no params
    assert shard_blocks(model) == [*model.layers, *model.single[0].convs]


def test_shard_blocks_leaves_out_blocks_with_tied_parameters() -> None:
    model = nn.Module()
    model.layers = nn.ModuleList(Stage() for _ in range(3))
    model.head = nn.Linear(2, 2)
    model.head.weight = model.layers[2].convs[0].weight
    assert shard_blocks(model) == list(model.layers[:2])


def _fsdp_ctx(option: str) -> Context:
    ctx = Context(Options(amp=option), nn.Linear(2, 2), None, None)
    ctx.device = torch.device("cpu")
    ctx.dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo", strategy="fsdp")
    return ctx


def test_amp_under_fsdp_hands_bf16_to_fsdp_and_stands_down_for_fp16() -> None:
    ctx = _fsdp_ctx("bf16")
    result = amp.run(ctx)
    assert result.status is Status.APPLIED and "MixedPrecisionPolicy" in result.detail
    assert ctx.amp_dtype is torch.bfloat16 and not ctx.forward_layers  # no autocast as well
    ctx = _fsdp_ctx("fp16")
    with pytest.warns(UserWarning, match="fp16 loss scaling is not supported under FSDP2"):
        result = amp.run(ctx)
    assert result.status is Status.SKIPPED and ctx.amp_dtype is None
    assert not ctx.forward_layers and "loss_scaler" not in ctx.extras


def test_full_state_dict_of_a_plain_model_is_its_state_dict() -> None:
    model = worker.make_model()
    saved = autoopt.full_state_dict(model)
    assert list(saved) == list(model.state_dict())
    other = worker.make_model(seed=1)
    autoopt.load_full_state_dict(other, saved)
    assert all(
        torch.equal(a, b) for a, b in zip(other.parameters(), model.parameters(), strict=True)
    )


def test_fp32_norms_are_the_norm_layers_with_running_statistics_and_weights() -> None:
    from autoopt.runtime.distributed.fsdp import fp32_norms

    model = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        nn.BatchNorm2d(4),
        nn.BatchNorm2d(4, affine=False),  # no weights to cast
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
        nn.InstanceNorm2d(4, affine=True),  # no running statistics: bf16 is fine
        nn.GroupNorm(2, 4),
        nn.SyncBatchNorm(4),
    )
    assert fp32_norms(model) == [model[1], model[3], model[6]]
