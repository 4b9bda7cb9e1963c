"""What `autoopt bench` shows of a run: its progress, the Markdown tables and the chart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def progress_line(label: str, done: int, total: int) -> None:
    """One line on stderr per step of the suite: '[ 3/40] cnn: bf16 (block 1/3)'."""
    width = len(str(total))
    print(f"[{done:>{width}}/{total}] {label}", file=sys.stderr, flush=True)


def _ratio(row: dict[str, Any], base: dict[str, Any]) -> float | None:
    if row.get("ms_median") and base.get("ms_median"):
        return row["ms_median"] / base["ms_median"]
    return None


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(results: dict[str, Any]) -> str:
    """The results as Markdown: one summary table, then one table per workload."""
    m = results["machine"]
    s = results["settings"]
    peak = m["peak_gflops"]
    out = [
        f"Machine: {m['cpu']} ({m['cores']} cores, {m['torch_threads']} torch threads), "
        f"device {m['device']}, torch {m['torch']}; measured matmul peak "
        f"{peak['fp32']} GFLOP/s fp32, {peak['bf16']} GFLOP/s bf16; "
        f"load average {m.get('load_avg_start')} -> {m.get('load_avg_end')}. "
        f"{s['warmup']} warm-up + {s['repeats']} x {s['steps']} timed steps per configuration, "
        + (
            "timed by the process's CPU time"
            if s.get("clock") == "cpu"
            else "timed by the wall clock"
        )
        + (
            ", each in its own process."
            if s.get("isolate")
            else ", all configurations of a workload interleaved block by block in one process."
        ),
        "",
        "Speed-ups are against eager fp32; a ratio is ms/step over ms/step (below 1: faster). "
        "Goals: optimize() >= 1.00x and optimize() / oracle <= 1.10; tune / oracle <= 1.03 "
        "and tune / optimize() <= 1.00.",
        "",
        "| workload | eager ms/step | optimize() | optimize(tune=True) | oracle | best peer "
        "| optimize() / oracle | tune / oracle | tune / optimize() | optimize() / best peer |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for w in results["workloads"]:
        rows = {r["name"]: r for r in w["configs"]}
        auto, tuned = rows.get("autoopt", {}), rows.get("autoopt-tune", {})
        oracle = rows.get(w["oracle"] or "", {})
        peer = rows.get(w["best_peer"] or "", {})
        out.append(
            f"| {w['name']} | {_fmt(w['eager_ms'], '.1f')} "
            f"| {_fmt(auto.get('speedup'), '.2f', 'x')} | {_fmt(tuned.get('speedup'), '.2f', 'x')} "
            f"| {w['oracle'] or '-'} ({_fmt(oracle.get('speedup'), '.2f', 'x')}) "
            f"| {w['best_peer'] or '-'} ({_fmt(peer.get('speedup'), '.2f', 'x')}) "
            f"| {_fmt(auto.get('vs_oracle'), '.3f')} | {_fmt(tuned.get('vs_oracle'), '.3f')} "
            f"| {_fmt(_ratio(tuned, auto), '.3f')} | {_fmt(auto.get('vs_best_peer'), '.3f')} |"
        )
    for w in results["workloads"]:
        out += [
            "",
            f"**{w['name']}**: {w['description']}; {w['params']:,} parameters, "
            f"{w['flops_per_step'] / 1e9:.2f} GFLOP per training step.",
            "",
            "| configuration | ms/step (median) | spread | speed-up | vs oracle | peak MiB "
            "| warm-up s | setup s | MFU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in w["configs"]:
            if r["status"] != "ok":
                out.append(f"| {r['name']} | {r['status']}: {r.get('reason', '')} ||||||||")
                continue
            out.append(
                f"| {r['name']} | {r['ms_median']:.2f} | ±{r['spread_pct'] / 2:.1f}% "
                f"| {_fmt(r.get('speedup'), '.2f', 'x')} | {_fmt(r.get('vs_oracle'), '.3f')} "
                f"| {_fmt(r.get('peak_mem_mb'), '.0f')} | {_fmt(r.get('warmup_s'), '.2f')} "
                f"| {_fmt(r.get('setup_s'), '.2f')} | {_fmt(r.get('mfu_pct'), '.1f', '%')} |"
            )
    return "\n".join(out) + "\n"


def plot(results: dict[str, Any], path: str | Path) -> None:
    """A bar chart of speed-up vs eager, one panel per workload (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from err
    colors = {"baseline": "#9e9e9e", "trick": "#90caf9", "autoopt": "#e65100", "peer": "#66bb6a"}
    workloads = results["workloads"]
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(max(4.2 * len(workloads), 8.0), 4.8), squeeze=False
    )
    for ax, w in zip(axes[0], workloads, strict=True):
        rows = [r for r in w["configs"] if r["status"] == "ok" and r.get("speedup")]
        names = [r["name"] for r in rows]
        ax.barh(names, [r["speedup"] for r in rows], color=[colors[r["kind"]] for r in rows])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_title(w["name"])
        ax.set_xlabel("speed-up vs eager fp32")
        ax.tick_params(axis="y", labelsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    fig.legend(handles, list(colors), loc="lower center", ncol=len(colors), frameon=False)
    fig.suptitle(f"autoopt bench: {results['machine']['cpu']}, {results['machine']['device']}")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
