"""Regional compile against whole-model compile: cold compile time and steady step time.

The model is a 12-block GPT (token + position embeddings, 12 pre-norm blocks of causal
self-attention through `F.scaled_dot_product_attention` and a 4x GELU MLP, final norm, LM head;
d=128, 4 heads, seq 64, vocab 512, batch 8), trained with AdamW on the CPU in fp32. Each way runs
`autoopt.optimize(model, optimizer=..., compile=True, amp=False)` with
`autoopt.runtime.passes.compile.REGIONAL` set to False (one graph of the whole forward) or True
(`block.compile()` on each of the 12 blocks), with inductor, in a fresh subprocess with an empty
`TORCHINDUCTOR_CACHE_DIR`, so every compile is cold. Eager runs the same way, uncompiled.

Both figures are CPU time, so that load from other processes on a shared machine does not count:
the process's own user+system time plus that of its finished children. Inductor compiles C++
kernels with `g++` subprocesses from a pool of worker processes; the pool's workers live on, so
their time would be lost: each run sets `TORCHINDUCTOR_COMPILE_THREADS=1` (compiles in the
process, each `g++` a waited-for child) and one torch thread (`--threads`), so CPU time is the
work done, not threads spinning. Wall time is reported beside it.

* cold: CPU time of the first training step (forward, backward, optimizer step), which holds
  dynamo's capture and inductor's forward and backward compiles;
* step: median CPU time of the timed steps after `--warmup` steps.

The ways run interleaved (eager, whole, regional, eager, whole, ...) `--repeats` times; each
figure is the median over the repeats.

Usage: `python -m benchmarks.regional_compile [--blocks 12] [--steps 20] [--warmup 3]
[--repeats 2] [--threads 1] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

WAYS = ("eager", "whole", "regional")


def build_gpt(blocks: int, d: int = 128, heads: int = 4, seq: int = 64, vocab: int = 512) -> Any:
    """A GPT-style LM whose blocks sit in an `nn.ModuleList` (as in nanoGPT)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).unbind(2)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its finished, waited-for children."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def measure(way: str, blocks: int, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    """Train in this process; cold = the first step, step = median of the timed steps; CPU
    and wall time in ms."""
    import torch
    from torch.nn import functional as F

    import autoopt
    from autoopt.runtime.passes import compile as compile_pass

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_gpt(blocks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if way != "eager":
        compile_pass.REGIONAL = way == "regional"
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=way != "eager", amp=False, verbose=False
    )
    tokens = torch.randint(0, 512, (8, 65))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> tuple[float, float]:
        cpu, wall = cpu_s(), time.perf_counter()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return (cpu_s() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3

    cold_cpu, cold_wall = step()
    for _ in range(warmup):
        step()
    timed = [step() for _ in range(steps)]
    result = autoopt.report(model)["compile"]
    return {
        "way": way,
        "cold_cpu_ms": cold_cpu,
        "cold_wall_ms": cold_wall,
        "step_cpu_ms": statistics.median(cpu for cpu, _ in timed),
        "step_wall_ms": statistics.median(wall for _, wall in timed),
        "compile": f"{result.status.value}: {result.detail}",
        "events": [str(e) for e in result.events],
    }


def run_isolated(way: str, blocks: int, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    """`measure` in a fresh interpreter with an empty inductor cache (a cold compile) that
    compiles in its own process (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "OMP_NUM_THREADS": str(threads),
        }
        code = (
            "import json, benchmarks.regional_compile as b; "
            f"print(json.dumps(b.measure({way!r}, {blocks}, {steps}, {warmup}, {threads})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per way: the median of each figure over its repeats, and the repeats."""
    rows = []
    for way in WAYS:
        mine = [r for r in runs if r["way"] == way]
        row: dict[str, Any] = {"way": way, "repeats": len(mine), "compile": mine[-1]["compile"]}
        for key in ("cold_cpu_ms", "cold_wall_ms", "step_cpu_ms", "step_wall_ms"):
            row[key] = statistics.median(r[key] for r in mine)
            row[f"{key}_all"] = [round(r[key], 1) for r in mine]
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown; ratios are CPU time over CPU time."""
    whole = next(r for r in rows if r["way"] == "whole")
    eager = next(r for r in rows if r["way"] == "eager")
    lines = [
        "| way | cold first step, CPU s | (wall s) | vs whole | steady step, CPU ms | (wall ms) "
        "| vs whole | vs eager |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['way']} | {r['cold_cpu_ms'] / 1e3:.1f} | {r['cold_wall_ms'] / 1e3:.1f} "
            f"| {r['cold_cpu_ms'] / whole['cold_cpu_ms']:.2f}x "
            f"| {r['step_cpu_ms']:.1f} | {r['step_wall_ms']:.1f} "
            f"| {r['step_cpu_ms'] / whole['step_cpu_ms']:.2f}x "
            f"| {r['step_cpu_ms'] / eager['step_cpu_ms']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args()
    runs = []
    for r in range(args.repeats):
        for way in WAYS:
            print(f"[{r + 1}/{args.repeats}] {way} ...", file=sys.stderr, flush=True)
            runs.append(run_isolated(way, args.blocks, args.steps, args.warmup, args.threads))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # survives an interrupt
    rows = summarise(runs)
    print(json.dumps({"rows": rows, "runs": runs}, indent=1) if args.json else table(rows))
    for row in rows:
        print(f"{row['way']}: compile {row['compile']}", file=sys.stderr)


if __name__ == "__main__":
    main()
