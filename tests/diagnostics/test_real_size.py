"""The real-size bench of the quick GPU check (benchmarks/gpu/real_size.py): its CPU rehearsal
tables every configuration, and its budget starts nothing the time left cannot cover, says why,
and keeps the eager reruns. Timings are never asserted."""

from __future__ import annotations

import json
from typing import Any

import torch

from benchmarks.gpu import real_size, tables

NAMES = [c.name for c in real_size.CONFIGS] + [real_size.RERUN]


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_budget_says_why_a_configuration_may_not_start() -> None:
    clock = FakeClock()
    budget = real_size.Budget(100, clock)
    guess = real_size.Estimate(50, "a guess")
    assert budget.why_not(guess, reserve_s=30) is None  # 100 - 30 >= 50
    clock.t = 30
    why = budget.why_not(guess, reserve_s=30)  # 70 - 30 < 50
    assert why == (
        "budget: ~50 s needed (a guess), 70 s of 100 s left, 30 s of them kept for the eager reruns"
    )
    # a compile's estimate must fit with its margin: 55 s left hold 50 s, not 50 x 1.25
    compiles = real_size.Estimate(50, "a compile", real_size.MARGIN)
    clock.t = 45
    assert budget.why_not(compiles, reserve_s=0) == (
        "budget: ~50 s needed (a compile; 62 s with its margin), 55 s of 100 s left"
    )
    clock.t = 35  # 65 s left
    assert budget.why_not(compiles, reserve_s=0) is None


def _row(name: str, wall: float, ready: float, status: str = "ok") -> dict[str, Any]:
    return {"name": name, "status": status, "wall_s": wall, "setup_s": ready}


def test_estimate_uses_the_compile_measured_on_the_workload_over_the_prior() -> None:
    settings = real_size.SETTINGS["real"]
    eager = _row("eager", wall=10, ready=2)
    before = real_size.estimate("compile", [eager], settings)
    assert before.seconds == 10 + settings.compile_prior_s and "prior" in before.basis
    done = [eager, _row("compile", 30, ready=22)]
    after = real_size.estimate("autoopt-tune", done, settings, plans=(4, 2))
    # Four plans and the winner's set-up at eager's cost, two compiled plans and the winner
    # at the 20 s compile measured.
    assert after.seconds == 10 * 5 + 3 * 20 and "compile's warm-up" in after.basis
    # An uncompiled configuration costs what eager did; nothing is estimated before eager ran.
    assert real_size.estimate("bf16", [eager], settings).seconds == 10
    assert real_size.estimate("bf16", [], settings).seconds == 0


def test_plan_gives_every_workload_its_key_rows_first() -> None:
    order = real_size.plan(["a", "b"])
    assert order[:6] == [
        ("eager", "a"),
        ("eager", "b"),
        ("autoopt", "a"),
        ("autoopt", "b"),
        ("bf16", "a"),
        ("bf16", "b"),
    ]
    assert order[-2:] == [(real_size.RERUN, "a"), (real_size.RERUN, "b")]


def test_run_skips_what_the_budget_cannot_cover_and_keeps_the_reruns(tmp_path, monkeypatch):
    """Each configuration costs 10 s of a fake clock: of 60 s, the two eager runs take 20, the
    reruns keep 20, so the compiled configurations (10 s + a 20 s compile prior) do not start,
    bf16 does on both workloads, and nothing else fits before the reruns."""
    clock = FakeClock()
    seen_tf32 = []

    def fake_measure(workload, config, settings, device):
        clock.t += 10
        # Like optimize() and pytorch-autotune: TF32 on for the whole process.
        seen_tf32.append(torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = True
        return {"name": config.name, "kind": config.kind, "status": "ok", "ms_median": 1.0,
                "noise_pct": 0.0, "wall_s": 10.0, "setup_s": 0.1}  # fmt: skip

    monkeypatch.setattr(real_size, "measure", fake_measure)
    monkeypatch.setattr(real_size.peers, "missing", lambda package: None)
    results = real_size.run(60, tmp_path, "tiny", ["gpt2", "encoder"], clock=clock)
    status = {(r["workload"], r["name"]): r["status"] for r in results["rows"]}
    ran = sorted(k for k, v in status.items() if v == "ok")
    assert ran == sorted(
        (w, n) for w in ("gpt2", "encoder") for n in ("eager", "bf16", real_size.RERUN)
    )
    autoopt = next(r for r in results["rows"] if r["name"] == "autoopt")
    assert autoopt["reason"] == (
        "budget: ~30 s needed (eager + a compile of 20 s (a prior: no compile measured here "
        "yet); 38 s with its margin), 40 s of 60 s left, 20 s of them kept for the eager reruns"
    )
    assert len(results["rows"]) == 2 * len(NAMES) and results["complete"]
    # Each configuration started from torch's flags as the run found them, and says what it
    # left set; the run leaves them as it found them.
    assert seen_tf32 == [False] * 6 and not torch.backends.cuda.matmul.allow_tf32
    assert all(r["flags_left"]["matmul.allow_tf32"] for r in results["rows"] if r["status"] == "ok")


def test_cpu_rehearsal_tables_every_configuration(tmp_path) -> None:
    """The real thing at the tiny size on one workload: the configurations that compile do not
    fit the budget (a 20 s compile prior is more than all of it) and say so; the others run
    (about a second in all); both tables and the JSON have every one."""
    assert real_size.SETTINGS["tiny"].compile_prior_s > 15
    results = real_size.run(15, tmp_path, "auto", ["encoder"])
    assert results["rehearsal"] and results["settings"]["size"] == "tiny"
    rows = {r["name"]: r for r in results["rows"]}
    assert list(rows) == NAMES
    for name in ("eager", "bf16", real_size.RERUN):
        assert rows[name]["status"] == "ok" and rows[name]["ms_median"] > 0, rows[name]
    for name in ("autoopt", "compile", "autoopt-tune"):
        assert rows[name]["status"] == "skipped"
        assert rows[name]["reason"].startswith("budget: ~"), rows[name]
    for name in ("accelerate-bf16", "pytorch-autotune"):  # run, or not installed
        assert rows[name]["status"] in ("ok", "skipped"), rows[name]
    saved = json.loads((tmp_path / "real-size.json").read_text())
    assert [r["name"] for r in saved["rows"]] == NAMES
    text = (tmp_path / "real-size.md").read_text()
    assert text == tables.markdown(saved)
    table = text[text.index("**encoder**") :]
    for name in NAMES:
        assert f"\n| {name} | " in table
    assert table.count("budget: ~") >= 3
    # Every table is headed by the device and says it is no GPU figure.
    assert text.count(tables.REHEARSAL + "***") == 2
