"""The Markdown of a real-size bench run (`real_size`): a summary, then one table per workload,
each headed by the device, torch and date (and, without CUDA, that it is a CPU rehearsal)."""

from __future__ import annotations

from typing import Any

REHEARSAL = "CPU rehearsal — not a GPU figure"
SUMMARY = ("autoopt", "bf16", "compile", "accelerate-bf16", "autoopt-tune", "pytorch-autotune")


def caption(results: dict[str, Any]) -> str:
    said = f"{results['device']} · torch {results['torch']} · {results['date']}"
    return f"*{said} · **{REHEARSAL}***" if results["rehearsal"] else f"*{said}*"


def _ok(rows: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    row = rows.get(name)
    return row if row and row["status"] == "ok" else None


def ratio(base: dict[str, Any] | None, row: dict[str, Any] | None) -> str:
    """base ms / row ms as 'N.NNx' (above 1: the row is faster); '-' when either is missing."""
    if not base or not row:
        return "-"
    return f"{base['ms_median'] / row['ms_median']:.2f}x"


def drift(rows: dict[str, dict[str, Any]]) -> str:
    first, again = _ok(rows, "eager"), _ok(rows, "eager (rerun)")
    if not first or not again:
        return "-"
    return f"{100 * (again['ms_median'] / first['ms_median'] - 1):+.1f}%"


def by_workload(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    grouped: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in results["workloads"]}
    for row in results["rows"]:
        grouped[row["workload"]][row["name"]] = row
    return grouped


def markdown(results: dict[str, Any]) -> str:
    s = results["settings"]
    grouped = by_workload(results)
    title = "Real-size bench" + (f" ({REHEARSAL}, tiny sizes)" if results["rehearsal"] else "")
    skipped = [r for r in results["rows"] if r["status"] != "ok"]
    out = [
        f"### {title}",
        "",
        caption(results),
        "",
        f"Budget {results['budget_s']:.0f} s, used {results['used_s']:.0f} s; "
        f"{len(results['rows']) - len(skipped)} configurations measured, {len(skipped)} not "
        f"(each with its reason below). Timed by {results['timer']}: {s['warmup']} warm-up "
        f"steps (the first timed apart), then {s['repeats']} blocks of {s['steps']} steps; "
        f"ms/step is the median block, noise half the range of the blocks. Ratios are ms/step "
        f"of eager fp32 (or eager bf16) over the configuration's: above 1 is faster. Load "
        f"average {results['load_avg_start']} -> {results.get('load_avg_end', '(running)')}. "
        f"Peers: {results['peers']}.",
    ]
    if results["running"]:
        out += ["", f"**Incomplete**: `{results['running']}` was running when this was written."]
    elif not results["complete"]:
        out += ["", "**Incomplete**: the run stopped between configurations."]
    out += [
        "",
        "| workload | eager fp32 ms/step | "
        + " | ".join(SUMMARY)
        + " | optimize() vs bf16 eager | eager rerun drift |",
        "|---|---:|" + "---:|" * (len(SUMMARY) + 2),
    ]
    for name, rows in grouped.items():
        eager = _ok(rows, "eager")
        cells = [ratio(eager, _ok(rows, c)) for c in SUMMARY]
        out.append(f"| {name} | {eager['ms_median']:.2f} | " if eager else f"| {name} | - | ")
        out[-1] += " | ".join(cells)
        out[-1] += f" | {ratio(_ok(rows, 'bf16'), _ok(rows, 'autoopt'))} | {drift(rows)} |"
    for name, rows in grouped.items():
        out += workload_table(results, name, rows)
    return "\n".join(out) + "\n"


def workload_table(
    results: dict[str, Any], name: str, rows: dict[str, dict[str, Any]]
) -> list[str]:
    w = results["workloads"][name]
    eager, bf16 = _ok(rows, "eager"), _ok(rows, "bf16")
    out = [
        "",
        f"**{name}**: {w['description']}; {w['params']:,} parameters.",
        "",
        caption(results),
        "",
        "| configuration | ms/step | noise | vs eager fp32 | vs bf16 eager | set-up + 1st step s "
        "| warm-up s | peak MiB | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows.values():
        if row["status"] != "ok":
            out.append(f"| {row['name']} | {row['status']} |||||||{_cell(row['reason'])} |")
            continue
        start = (row.get("setup_s") or 0) + (row.get("first_step_s") or 0)
        out.append(
            f"| {row['name']} | {row['ms_median']:.2f} | ±{row['noise_pct']:.1f}% "
            f"| {ratio(eager, row)} | {ratio(bf16, row)} | {start:.1f} "
            f"| {row.get('warmup_s', 0):.1f} | {row.get('peak_mem_mb', 0):.0f} | {notes(row)} |"
        )
    return out


def notes(row: dict[str, Any]) -> str:
    said = []
    if row.get("applied"):
        said.append("applied: " + "; ".join(row["applied"]))
    if row.get("pick"):
        said.append(f"picked {row['pick']}")
    if row.get("flags_left"):
        said.append("left set: " + ", ".join(f"{k}={v}" for k, v in row["flags_left"].items()))
    return _cell(" · ".join(said))


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")
