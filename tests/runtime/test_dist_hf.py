"""DDP and FSDP2 on real model code in two processes (gloo, torchrun; dist_hf_worker.py): a tiny
GPT-2 from transformers against torch's own DDP / fully_shard loop and one process on the global
batch, full state dicts resumed into a plain model and optimizer, and a BatchNorm CNN under FSDP2
with bf16."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from .torchrun import load_worker, run_two_processes  # noqa: E402

WORKER = Path(__file__).with_name("dist_hf_worker.py")
worker = load_worker(WORKER)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_two_processes(WORKER, tmp_path_factory.mktemp("dist_hf"), timeout=240)


def _one_process(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """GPT-2 trained in one plain process on the global batch, uninterrupted: torch only."""
    model = worker.make_gpt2(seed=0)
    opt = worker.make_optimizer(model)
    data = torch.utils.data.DataLoader(worker.make_tokens(), batch_size=worker.GLOBAL_BATCH)
    losses: list[float] = []
    while len(losses) < steps:
        for (ids,) in data:
            opt.zero_grad()
            loss = worker.lm_loss(model, ids)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, model.state_dict()


def _report(phase: dict[str, Any]) -> dict[str, str]:
    return {e["pass"]: e["detail"] for e in phase["report"]}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gpt2_trains_as_torchs_own_loop_and_one_process(
    results: list[dict[str, Any]], strategy: str
) -> None:
    expected, _ = _one_process(worker.STEPS)
    for result in results:
        phase = result[strategy]
        torch.testing.assert_close(phase["ours"], phase["theirs"], rtol=1e-6, atol=0)
        torch.testing.assert_close(phase["ours"], expected, rtol=1e-5, atol=0)
    assert results[0][strategy]["state_diff"] < 1e-5  # parameters, as `worker.comparable`
    name = {"ddp": "DDP", "fsdp": "FSDP2"}[strategy]
    detail = _report(results[0][strategy])["distributed"]
    assert detail.startswith(f"{name} over 2 processes")
    # A single process would have timed AdamW's step implementations on the CPU.
    assert "not measured under torchrun, taken as chosen: the optimizer step" in detail


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_full_state_dicts_resume_into_plain_torch_as_an_uninterrupted_run(
    results: list[dict[str, Any]], strategy: str
) -> None:
    losses, state = _one_process(2 * worker.STEPS)
    assert results[0][strategy]["keys"] == sorted(state)  # the user's keys: no `module.`
    assert results[1][strategy]["keys"] == []  # only rank 0 gets the full copy
    resumed = results[0][strategy]["resumed"]
    # AdamW's moments and step counts came back too, else the continued losses would differ.
    torch.testing.assert_close(resumed["losses"], losses[worker.STEPS :], rtol=1e-5, atol=0)
    saved = {name: torch.tensor(value) for name, value in resumed["state"].items()}
    assert worker.max_diff(saved, state) < 1e-5


def test_bf16_fsdp_on_a_batchnorm_cnn_keeps_the_norms_fp32_as_torchs_own_loop(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        bn = result["bn"]
        torch.testing.assert_close(bn["ours"], bn["theirs"], rtol=1e-6, atol=0)
    assert results[0]["bn"]["state_diff"] < 1e-6
    assert results[0]["bn"]["bn_dtype"] == "torch.float32"
    # Per-rank statistics: the ranks' losses differ (each normalises its own 4 images).
    assert results[0]["bn"]["ours"] != results[1]["bn"]["ours"]
    detail = _report(results[0]["bn"])["distributed"]
    assert "5 shard units (2 blocks + 2 BatchNorm layers in fp32 + the root)" in detail
    assert "2 BatchNorm layers normalise each rank's batch over its own samples" in detail
    assert "SyncBatchNorm, which would normalise over the global batch, needs a GPU" in detail
    assert "BatchNorm" not in _report(results[0]["fsdp"])["distributed"]  # GPT-2 has none
