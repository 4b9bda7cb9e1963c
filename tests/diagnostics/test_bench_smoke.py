"""A smoke test of the benchmark harness and `autoopt bench`: one tiny workload, every
configuration, 2 timed steps. It checks the shape of the results, never the timings."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.nn import functional as F

from autoopt.cli import main
from autoopt.diagnostics import bench
from autoopt.diagnostics.bench import flags, harness, workloads


def _tiny_data(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


TINY = workloads.Workload(
    "tiny",
    "Linear(8, 16)-ReLU-Linear(16, 3), batch 4",
    lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)),
    _tiny_data,
    F.cross_entropy,
    batch_size=4,
    batches=2,
)

ROW_KEYS = {"name", "kind", "status"}
OK_KEYS = {
    "ms_median",
    "ms_min",
    "ms_max",
    "spread_pct",
    "warmup_s",
    "setup_s",
    "peak_mem_mb",
    "speedup",
    "vs_oracle",
    "vs_best_peer",
    "mfu_pct",
    "repeats_ms",
}


@pytest.fixture()
def results(tmp_path, monkeypatch):
    monkeypatch.setitem(harness.WORKLOADS, "tiny", TINY)
    monkeypatch.setenv("AUTOOPT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    args = [
        "bench",
        "--workload",
        "tiny",
        "--steps",
        "2",
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--no-isolate",
        "--json",
        str(out),
        "--markdown",
        str(tmp_path / "bench.md"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "| tiny |" in result.stdout  # the summary table on stdout
    # Progress on stderr, one line per step of the suite, naming the workload and configuration
    # (not a bar: stderr is not a terminal here).
    lines = result.stderr.splitlines()
    n = len(harness.config_names(TINY)) * 2  # set-up, then one timed block each
    assert lines[0] == "[ 0/" + str(n) + "] tiny: eager (set-up + 1 warm-up steps)", lines[:3]
    assert "] tiny: autoopt-tune (block 1/1)" in result.stderr
    assert f"[{n}/{n}] done" in lines and "tiny: autoopt (block 1/1)" in result.stderr
    return json.loads(out.read_text())


def test_every_configuration_has_a_number_or_a_reason(results):
    assert results["schema"] == harness.SCHEMA
    assert results["settings"] == {
        "steps": 2,
        "repeats": 1,
        "warmup": 1,
        "isolate": False,
        "clock": "wall",
    }
    peers = {"accelerate-fp32", "accelerate-fp32+compile", "fabric-fp32", "fabric-bf16"}
    assert peers <= set(harness.config_names(TINY))  # fp32 peers, not only bf16 ones
    assert results["machine"]["peak_gflops"]["best"] > 0
    (w,) = results["workloads"]
    assert w["name"] == "tiny" and w["flops_per_step"] > 0
    rows = {r["name"]: r for r in w["configs"]}
    assert set(rows) == set(harness.config_names(TINY))
    for row in w["configs"]:
        assert set(row) >= ROW_KEYS, row
        if row["status"] == "ok":
            assert set(row) >= OK_KEYS, row
            assert row["ms_median"] > 0 and len(row["repeats_ms"]) == 1
        else:
            assert row["status"] == "skipped" and row["reason"], row  # a failure is a bug
    for name in ("eager", "bf16", "compile", "autoopt", "autoopt-tune"):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["eager"]["speedup"] == 1.0
    # The oracle is the fastest hand-applied configuration, so nothing of that kind beats it.
    oracle = rows[w["oracle"]]
    assert oracle["vs_oracle"] == 1.0 and oracle["kind"] in ("baseline", "trick")
    assert "ms/step" in rows["autoopt-tune"]["tune"]  # the tuning table rides along


def test_markdown_and_plot(results, tmp_path):
    md = bench.markdown(results)
    assert md.count("| eager |") == 1 and "tune / oracle" in md
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    bench.plot(results, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_workload_is_a_usage_error():
    result = CliRunner().invoke(main, ["bench", "--workload", "nope"])
    assert result.exit_code == 2
    assert "cnn" in result.output


def test_the_best_peer_is_the_fastest_of_all_peer_configurations() -> None:
    def row(name: str, kind: str, ms: float) -> dict:
        return {"name": name, "kind": kind, "status": "ok", "ms_median": ms}

    rows = [
        row("eager", "baseline", 10.0),
        row("bf16", "trick", 40.0),  # bf16 emulated: slower than eager
        row("autoopt", "autoopt", 9.0),
        row("accelerate-bf16", "peer", 45.0),
        row("accelerate-fp32", "peer", 9.5),
        row("fabric-fp32", "peer", 10.5),
    ]
    summary = harness.summarise(TINY, rows, flops=0, peak_gflops=1.0)
    assert summary["best_peer"] == "accelerate-fp32" and summary["oracle"] == "eager"
    assert rows[2]["vs_best_peer"] == round(9.0 / 9.5, 3)


def test_the_cpu_clock_times_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(1000))
    monkeypatch.setitem(harness.CLOCKS, "cpu", lambda: next(ticks) * 0.004)  # 4 ms a read
    eager = harness.Config("eager", "baseline")
    row = harness.run_config(TINY, eager, steps=2, repeats=3, warmup=0, clock="cpu")
    # One read before and one after each block of 2 steps: 4 ms / 2 steps, every block.
    assert row["repeats_ms"] == [2.0, 2.0, 2.0], row


def test_the_cpu_clock_is_refused_for_an_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown clock"):
        harness.run_suite(["mlp"], clock="gpu")


def test_bench_cli_passes_clock_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_suite(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(harness, "run_suite", fake_suite)
    result = CliRunner().invoke(main, ["bench", "--clock", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert seen["clock"] == "cpu" and seen["threads"] == 1


def test_interleaved_blocks_run_with_each_configurations_own_flags(monkeypatch) -> None:
    """optimize() turns TF32 on for the whole process on CUDA: eager's blocks, interleaved with
    autoopt's, still run with the flags the suite found, and autoopt's with the ones it set."""
    seen: dict[str, list[bool]] = {"eager": [], "autoopt": []}

    def prepare(config, workload, model, loader, optimizer, device):
        if config.name == "autoopt":  # what optimize()'s backends pass does on CUDA
            torch.backends.cuda.matmul.allow_tf32 = True

        def step(x, y):
            seen[config.name].append(torch.backends.cuda.matmul.allow_tf32)
            return torch.zeros(())

        return loader, step, {}

    monkeypatch.setattr(harness, "_prepare", prepare)
    configs = [c for c in harness.configs_for(TINY) if c.name in ("eager", "autoopt")]
    before = flags.read()
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        harness.run_interleaved(
            TINY, configs, steps=1, repeats=2, warmup=1, device=torch.device("cpu"), ticker=print
        )
        after = torch.backends.cuda.matmul.allow_tf32
    finally:
        flags.restore(before)
    # One warm-up step, then two blocks of one step each.
    assert seen == {"eager": [False] * 3, "autoopt": [True] * 3}
    assert after is False  # as the suite found it
