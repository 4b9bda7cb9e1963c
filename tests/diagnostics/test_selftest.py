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


@pytest.mark.parametrize(
    ("ours", "torchs", "status"),
    [(4.6e-4, 6.6e-4, "ok"), (8e-4, 6.6e-4, "mismatch"), (5e-5, 6.6e-4, "ok")],
)
def test_the_compile_row_passes_within_torchs_own_compile_vs_eager_difference(
    monkeypatch: pytest.MonkeyPatch, ours: float, torchs: float, status: str
) -> None:
    """optimize()'s compile against torch.compile by hand: a difference over the fp32 tolerance
    passes only when torch's own compile differs from eager by at least as much (the rounding
    floor of compiled fp32 steps on that workload), measured in the same run."""
    first = selftest.Row("compile", "ok" if ours <= 1e-4 else "mismatch", "applied", ours, 1e-4)
    made: list[selftest.ByHand] = []

    def by_hand(build: object, device: object, how: selftest.ByHand) -> tuple[str, str]:
        made.append(how)
        return ("compiled" if how.compile else "eager"), "step"

    def diff(a: str, b: str, *_: object) -> float:
        assert (a, b) == ("compiled", "eager")  # torch's compile against eager, nothing else
        return torchs

    monkeypatch.setattr(selftest, "compare", lambda *a, **k: first)
    monkeypatch.setattr(selftest, "by_hand", by_hand)
    monkeypatch.setattr(selftest, "train", lambda step, batches: [0.0])
    monkeypatch.setattr(selftest, "max_relative_diff", diff)
    work = selftest.workloads(quick=True)["cnn"]
    row = selftest.check_compile(_setting(), work)
    assert row.status == status
    if ours > 1e-4:
        assert [h.compile for h in made] == [True, False]
        assert row.tolerance == (torchs if status == "ok" else 1e-4)
    else:
        assert made == []  # within the fp32 tolerance: nothing more is run
