"""`autoopt selftest`: the quick mode passes here (it is CI's proof that each pass equals torch's
own loop on this machine), and a pass that computes something else is reported as a mismatch."""

from __future__ import annotations

import json
import os
import re

import click
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


# --- the report: a line per check as it runs, 80 columns, a slow "ok" explained ---------------

LONG = (
    "applied: wrapped (num_workers=0 (in-memory TensorDataset: workers would only add IPC)): "
    "batches moved to cpu; 4 batches, same order and values, on cpu"
)


def _rows() -> list[selftest.Row]:
    return [
        selftest.Row("loader", "ok", LONG, note="4 batches, same order and values, on cpu"),
        selftest.Row("amp bf16", "ok", "applied: bf16", 0.0, 3e-2, 0.39, "", (0.35, 0.42), 3.1),
        selftest.Row("accumulate", "ok", "applied", 0.0, 1e-4, 0.8, "", (0.6, 1.1), 2.0),
        selftest.Row("channels_last", "ok", "applied", 0.0, 1e-4, 1.3, "", (1.2, 1.4), 2.0),
        selftest.Row("compile", "skipped", "--quick on CPU: a cold compile takes tens of " * 3),
        selftest.Row("checkpoint (memory budget)", "mismatch", LONG, 2e-3, 1e-4, note=LONG),
    ]


@pytest.mark.parametrize("verbose", [False, True])
def test_the_report_fits_80_columns_without_cutting_a_word(verbose: bool) -> None:
    for row in _rows():
        text = selftest.row_lines(row, verbose)
        lines = text.splitlines()
        assert all(len(line) <= 80 for line in lines), text
        assert lines[0].startswith(f"{row.status:<9}{row.check}")
        words = " ".join(line.strip() for line in lines[1:]).split()
        said = " ".join(
            filter(
                None,
                [
                    "; ".join(p for p in (row.applied, row.note) if p)
                    if row.status != "ok"
                    else row.slow_reason(),
                    *(
                        [f"optimize() says: {row.applied}", row.note]
                        if verbose and row.status == "ok"
                        else []
                    ),
                ],
            )
        )
        assert words == said.split()  # every word whole, in order: wrapped, never cut
    header = selftest.header("CPU: AMD EPYC (torch 2.13.0+cpu)", True, 1)
    assert all(len(line) <= 80 for line in header.splitlines())


def test_a_slow_ok_is_explained_with_the_runs_own_noise() -> None:
    slow, noisy, fast, *_ = _rows()[1:]
    assert slow.slow_reason() == (
        "slower than by hand in every block of this run (0.35x-0.42x, by hand 3.1 ms/step)"
    )
    assert noisy.slow_reason() == (
        "slower in the median, within this run's noise (blocks 0.60x-1.10x)"
    )
    assert fast.slow_reason() == ""
    assert "slower" in selftest.row_lines(slow)  # said by default, not only with --verbose
    # What it means is said once, under the report, and only when a check was slower.
    said = selftest.verdict([slow, noisy, fast], 12.0)
    assert said.count("the results match") == 1 and said.endswith("all checks passed; 12 s\n")
    assert "results match" not in selftest.verdict([fast], 12.0)


def test_each_check_is_printed_as_soon_as_it_is_done(monkeypatch) -> None:
    events: list[str] = []

    def check(name: str) -> selftest.Row:
        events.append(f"run {name}")
        return selftest.Row(name, "ok", "applied")

    plan = [(name, lambda name=name: check(name)) for name in ("first", "second")]
    monkeypatch.setattr(selftest, "planned_checks", lambda quick, device: plan)
    echo = click.echo

    def recording_echo(message=None, *args, **kwargs):
        events.append(f"echo {click.unstyle(str(message or ''))}")
        return echo(message, *args, **kwargs)

    monkeypatch.setattr(click, "echo", recording_echo)
    result = CliRunner().invoke(main, ["selftest", "--quick"])
    assert result.exit_code == 0, result.output
    said_first = next(i for i, e in enumerate(events) if e.startswith("echo ok       first"))
    assert said_first < events.index("run second")
    assert events.index("run first") > next(
        i for i, e in enumerate(events) if "autoopt selftest on" in e
    )  # the header before the first check
    assert result.stdout.rstrip().splitlines()[-1].startswith("all checks passed; ")


def test_quick_mode_on_the_cpu_runs_one_torch_thread_and_restores_them() -> None:
    before = torch.get_num_threads()
    with selftest.check_threads(quick=True, device="cpu") as threads:
        assert threads == torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with selftest.check_threads(quick=False, device="cpu") as threads:
        assert threads == before


def test_the_profiler_keeps_its_own_lines_off_the_terminal(capfd) -> None:
    from autoopt.diagnostics import measured_memory

    with measured_memory.profiler_quiet():
        os.write(2, b"USDT:2026-11-27 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning the user must see\n")
        os.write(
            2,
            b"[W1127 15:13:47.851682785 CPUAllocator.cpp:245] Memory block of unknown size was "
            b"allocated before the profiling started, profiler results will not include the "
            b"deallocation event\n",
        )
    assert measured_memory.allocated_peak(lambda: torch.randn(64).sum()) > 0
    err = capfd.readouterr().err
    assert "a warning the user must see" in err
    assert "USDT" not in err and "profiler_" not in err and "CPUAllocator" not in err
