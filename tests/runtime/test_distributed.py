"""The distributed pass: a real two-process DDP run (gloo, torchrun) and the setup errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from autoopt.runtime.context import Context
from autoopt.runtime.options import Options
from autoopt.runtime.passes import distributed
from autoopt.runtime.passes.distributed import AutooptDDP, DistributedSetupError
from autoopt.runtime.report import Status

from .torchrun import TORCHRUN_ENV, load_worker, run_two_processes

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_two_processes(WORKER, tmp_path_factory.mktemp("ddp"), timeout=180)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def single_group(tmp_path: Path) -> Any:
    """A real one-process gloo group, destroyed afterwards."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _ctx(distributed_option: Any = "auto") -> Context:
    options = Options(distributed=distributed_option)
    return Context(options=options, model=nn.Linear(2, 2), loader=None, optimizer=None)


def _torchrun_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    base = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    base.update(values)
    for name, value in base.items():
        if value == "":
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


# ---- the two-process run ----------------------------------------------------------------------


@pytest.mark.slow
def test_parameters_are_identical_on_both_ranks(ddp_results: list[dict[str, Any]]) -> None:
    r0, r1 = (r["plain"] for r in ddp_results)
    assert ddp_results[0]["world_size"] == 2
    assert r0["initial"] == r1["initial"]  # rank 0's initialisation was broadcast
    assert r0["final"] == r1["final"]
    assert r0["final"] != r0["initial"]  # and it did train
    assert r0["is_ddp"] and r0["model_type"] == "AutooptDDP"
    report = {entry["pass"]: entry for entry in r0["report"]}
    assert report["distributed"]["status"] == "applied"
    assert "DistributedSampler(shuffle=True" in report["loader"]["detail"]


@pytest.mark.slow
def test_each_rank_sees_a_disjoint_half_and_epochs_reshuffle(
    ddp_results: list[dict[str, Any]],
) -> None:
    samples = load_worker(WORKER).SAMPLES
    r0, r1 = (r["plain"]["seen"] for r in ddp_results)
    for epoch in range(2):
        a, b = set(r0[epoch]), set(r1[epoch])
        assert len(r0[epoch]) == len(r1[epoch]) == samples // 2
        assert not a & b and a | b == set(range(samples))
    assert r0[0] != r0[1]  # set_epoch(1) was called before the second pass


@pytest.mark.slow
def test_state_dict_keys_have_no_module_prefix(ddp_results: list[dict[str, Any]]) -> None:
    plain = ddp_results[0]["plain"]
    assert plain["keys"] == ["weight", "bias"] == plain["unwrapped_keys"]
    assert plain["in_features"] == 4


@pytest.mark.slow
def test_accumulate_syncs_once_per_step_and_matches_the_big_batch_step(
    ddp_results: list[dict[str, Any]],
) -> None:
    worker = load_worker(WORKER)
    r0, r1 = (r["accumulate"] for r in ddp_results)
    per_rank_batches = worker.SAMPLES // 2 // worker.BATCH
    assert r0["syncs"] == r1["syncs"] == per_rank_batches // 2  # one all-reduce per step
    assert r0["final"] == r1["final"]
    assert r0["seen"] == list(range(0, worker.SAMPLES, 2))  # unshuffled, interleaved shards
    # Reference: a plain model stepping once per 2 micro-batches x 2 ranks on the mean loss.
    data = worker.make_data()
    model = nn.Linear(4, 1)
    model.load_state_dict({k: torch.tensor(v) for k, v in r0["initial"].items()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(per_rank_batches // 2):
        opt.zero_grad()
        losses = []
        for seen in (r0["seen"], r1["seen"]):
            for micro in range(2):
                start = (2 * step + micro) * worker.BATCH
                idx = torch.tensor(seen[start : start + worker.BATCH])
                x, y, _ = data[idx]
                losses.append(nn.functional.mse_loss(model(x), y))
        (sum(losses) / len(losses)).backward()
        opt.step()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(torch.tensor(r0["final"][name]), value, atol=1e-6, rtol=0)


# ---- decisions and setup errors, in-process ---------------------------------------------------


def test_single_process_is_skipped_and_false_is_skipped(clean_env: pytest.MonkeyPatch) -> None:
    result = distributed.run(_ctx())
    assert result.status is Status.SKIPPED and "single process" in result.detail
    clean_env.setenv("WORLD_SIZE", "1")
    assert distributed.run(_ctx()).status is Status.SKIPPED
    assert distributed.run(_ctx(False)).detail == "distributed=False"


def test_true_without_torchrun_is_a_clear_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(DistributedSetupError, match="torchrun --nproc_per_node"):
        distributed.run(_ctx(True))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"MASTER_ADDR": "", "MASTER_PORT": ""}, "MASTER_ADDR, MASTER_PORT are not set"),
        ({"LOCAL_RANK": ""}, "LOCAL_RANK is not set"),
        ({"RANK": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
        ({"RANK": "one"}, "RANK='one' is not an integer"),
        ({"RANK": "0", "LOCAL_RANK": "1"}, "LOCAL_RANK=1 is impossible for RANK=0"),
    ],
)
def test_bad_torchrun_environment_is_a_clear_error(
    clean_env: pytest.MonkeyPatch, values: dict[str, str], message: str
) -> None:
    _torchrun_env(clean_env, **values)
    with pytest.raises(DistributedSetupError, match=message):
        distributed.run(_ctx())
    assert not dist.is_initialized()  # the error comes before any rendezvous (no hang)


def test_existing_group_that_disagrees_with_the_env_is_an_error(
    clean_env: pytest.MonkeyPatch, single_group: None
) -> None:
    _torchrun_env(clean_env)
    with pytest.raises(DistributedSetupError, match="existing process group has world_size 1"):
        distributed.run(_ctx())
    _torchrun_env(clean_env, WORLD_SIZE="1", RANK="3", LOCAL_RANK="0")
    with pytest.raises(DistributedSetupError, match="rank 0 but the environment says RANK=3"):
        distributed.run(_ctx())


def test_existing_single_process_group_is_skipped(
    clean_env: pytest.MonkeyPatch, single_group: None
) -> None:
    result = distributed.run(_ctx())
    assert result.status is Status.SKIPPED and "one process" in result.detail


def test_local_rank_beyond_the_gpus_is_an_error() -> None:
    count = torch.cuda.device_count()
    with pytest.raises(DistributedSetupError, match=f"LOCAL_RANK={count} but this node has"):
        distributed._check_device(count, torch.device("cuda"))
    distributed._check_device(5, torch.device("cpu"))  # CPU ranks share the host: fine


class Tagged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 2)
        self.note = "tagged"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def describe(self) -> str:
        return f"{self.note}:{self.body.out_features}"


def test_ddp_wrapper_looks_like_the_inner_module(single_group: None) -> None:
    inner = Tagged()
    wrapped = AutooptDDP(inner)
    assert list(wrapped.state_dict()) == ["body.weight", "body.bias"]
    plain = Tagged()
    plain.load_state_dict(wrapped.state_dict())  # loads into an un-optimized copy
    fresh = Tagged()
    wrapped.load_state_dict(fresh.state_dict())
    assert torch.equal(inner.body.weight, fresh.body.weight)
    assert wrapped.note == "tagged" and wrapped.describe() == "tagged:2"
    assert wrapped.body is inner.body  # submodules too
    assert wrapped(torch.ones(1, 3)).shape == (1, 2)
    with pytest.raises(AttributeError):
        _ = wrapped.does_not_exist


def test_ddp_wrapper_frees_its_reducer_before_its_process_group(single_group: None) -> None:
    # torch's Reducer lets go of the group with the GIL held; were it the last holder, gloo's
    # destructor could wait forever on a worker thread that needs the GIL (issue 24's hang).
    wrapped = AutooptDDP(nn.Linear(2, 2))
    assert {"reducer", "logger", "process_group"} <= set(vars(wrapped))
    wrapped.__del__()
    assert "reducer" not in vars(wrapped) and "logger" not in vars(wrapped)
    assert vars(wrapped)["process_group"] is not None  # released later, without the GIL


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.body(x))


def test_full_state_dicts_of_a_ddp_model_have_the_users_keys_and_load_back(
    single_group: None,
) -> None:
    import autoopt

    torch.manual_seed(0)
    inner = Normed()
    wrapped = AutooptDDP(inner)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=0.1)
    wrapped(torch.randn(8, 3)).pow(2).mean().backward()
    opt.step()
    saved = autoopt.full_state_dict(wrapped)
    assert list(saved) == list(inner.state_dict())  # no `module.` either way
    assert all(torch.equal(saved[k], v) for k, v in inner.state_dict().items())
    saved_opt = autoopt.full_optimizer_state_dict(wrapped, opt)
    assert set(saved_opt["state"]) == {"body.weight", "body.bias", "bn.weight", "bn.bias"}

    torch.manual_seed(1)
    other = AutooptDDP(Normed())
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    autoopt.load_full_state_dict(other, saved)
    autoopt.load_full_optimizer_state_dict(other, other_opt, saved_opt)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in saved.items())
    theirs = other_opt.state_dict()["state"]
    for index, state in opt.state_dict()["state"].items():
        assert all(torch.equal(theirs[index][k], v) for k, v in state.items())


def test_batchnorm_note_says_statistics_are_per_rank() -> None:
    model = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.BatchNorm1d(4))
    ddp = distributed.batchnorm_note(model, "ddp", torch.device("cpu"))
    assert ddp.startswith("2 BatchNorm layers normalise each rank's batch over its own samples")
    assert "DDP copies rank 0's running statistics" in ddp and "needs a GPU" in ddp
    fsdp = distributed.batchnorm_note(model, "fsdp", torch.device("cuda", 0))
    assert "each rank keeps its own running statistics" in fsdp
    assert "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)" in fsdp
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert distributed.batchnorm_note(synced, "ddp", torch.device("cuda", 0)) == ""
    assert distributed.batchnorm_note(nn.Linear(2, 2), "ddp", torch.device("cpu")) == ""


def test_unmeasured_note_names_what_torchrun_takes_without_timing() -> None:
    from autoopt.runtime.context import DistState

    ctx = Context(Options(amp="auto"), nn.Linear(2, 2), None, None)
    ctx.device = torch.device("cpu")
    ctx.dist = DistState(rank=0, world_size=2, local_rank=0, backend="gloo", strategy="ddp")
    ctx.amp_dtype = torch.bfloat16
    assert distributed.unmeasured_note(ctx, step_untimed=True) == (
        "not measured under torchrun, taken as chosen: bf16 from the CPU's features (not timed "
        "against fp32) and the optimizer step implementation (not timed against the default)"
    )
    ctx.options = Options(amp="bf16")  # asked for: nothing to time
    assert distributed.unmeasured_note(ctx, step_untimed=False) == ""
    ctx.device = torch.device("cuda", 0)  # a single process does not time these on CUDA either
    assert distributed.unmeasured_note(ctx, step_untimed=True) == ""
