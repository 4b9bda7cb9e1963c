"""`autoopt selftest`: the quick mode passes here (it is CI's proof that each pass equals torch's
own loop on this machine), and a pass that computes something else is reported as a mismatch."""

from __future__ import annotations

import json
import re

import pytest
import torch
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.diagnostics import selftest


@pytest.mark.slow
def test_quick_selftest_passes_here() -> None:
    result = CliRunner().invoke(main, ["selftest", "--quick", "--json"])
    report = json.loads(result.stdout)
    rows = {r["check"]: r for r in report["checks"]}
    assert result.exit_code == 0, result.output
    expected = {"loader", "channels_last", "amp bf16", "amp fp16 + loss scaling", "accumulate"}
    expected |= {"memory budget (does not fit)"}
    assert expected | {"checkpoint (memory budget)", "compile", "distributed"} == set(rows)
    for name in expected:
        no_bf16 = name == "amp bf16" and rows[name]["applied"].startswith("no native bf16")
        assert rows[name]["status"] == ("skipped" if no_bf16 else "ok"), rows[name]
    for row in rows.values():
        if row["max_diff"] is not None:
            assert row["max_diff"] <= row["tolerance"]
            untimed = row["check"] == "memory budget (does not fit)"  # about memory, not speed
            assert row["speedup"] is None if untimed else row["speedup"] > 0


def _setting() -> selftest.Setting:
    return selftest.Setting(torch.device("cpu"), quick=True, bf16=True, distributed=False)


def test_a_pass_that_computes_something_else_is_a_mismatch() -> None:
    work = selftest.workloads(quick=True)["cnn"]
    # optimize() applies channels_last; the reference adds bf16 autocast: not the same training.
    row = selftest.compare(
        _setting(),
        "channels_last",
        work,
        "channels_last",
        {"channels_last": True},
        selftest.ByHand(autocast=torch.bfloat16, channels_last=True),
        "fp32",
    )
    assert row.status == "mismatch" and row.max_diff > row.tolerance


def test_a_pass_that_is_not_applied_is_a_mismatch() -> None:
    work = selftest.workloads(quick=True)["lstm"]
    row = selftest.compare(
        _setting(), "accumulate", work, "accumulate", {}, selftest.ByHand(accumulate=2), "fp32"
    )
    assert row.status == "mismatch" and "did not apply" in row.note


def test_fp16_invariant_catches_a_scale_that_does_not_back_off(monkeypatch) -> None:
    from autoopt.runtime.scaling.loss_scaling import LossScaler

    monkeypatch.setattr(LossScaler, "update", lambda self, found: None)
    row = selftest.check_fp16_scaling(_setting(), selftest.workloads(quick=True)["transformer"])
    assert row.status == "mismatch"
    assert "injected inf" in row.note


@pytest.mark.slow
def test_selftest_under_torchrun_checks_ddp_against_ddp_by_hand(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "autoopt",
            "selftest",
            "--quick",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])  # rank 0 alone prints
    (row,) = [r for r in report["checks"] if r["check"].startswith("distributed")]
    assert row["status"] == "ok" and row["max_diff"] <= row["tolerance"], row
    assert "2 ranks" in row["note"]


@pytest.mark.slow
def test_a_planned_peak_off_the_measured_one_by_more_than_10_percent_is_a_mismatch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autoopt.diagnostics import measured_memory

    work = selftest.workloads(quick=True)["transformer"]
    real = measured_memory.step_peak
    # The same step measured 25% heavier than it is: the plan is then about 20% under it.
    monkeypatch.setattr(measured_memory, "step_peak", lambda *args: int(real(*args) * 1.25))
    row = selftest.check_memory_fit(_setting(), work)
    assert row.status == "mismatch", row
    off = re.search(r"planned peak .* \(([+-]\d+)%\)$", row.note)
    assert off is not None and int(off.group(1)) < -10, row.note
