"""Regional compile against whole-model compile: cold compile time and steady step time.

The model is a 12-block GPT (token + position embeddings, 12 pre-norm blocks of causal
self-attention through `F.scaled_dot_product_attention` and a 4x GELU MLP, final norm, LM head;
d=128, 4 heads, seq 64, vocab 512, batch 8), trained with AdamW on the CPU in fp32. Each way runs
`autoopt.optimize(model, optimizer=..., compile=True, amp=False)` with
`autoopt.runtime.passes.compile.REGIONAL` set to False (one graph of the whole forward) or True
(`block.compile()` on each of the 12 blocks), with inductor, in a fresh subprocess with an empty
`TORCHINDUCTOR_CACHE_DIR`, so every compile is cold. Eager runs the same way, uncompiled.

* cold: wall time of the first training step (forward, backward, optimizer step), which holds
  dynamo's capture and inductor's forward and backward compiles;
* step: median of the timed steps after `--warmup` steps.

Usage: `python benchmarks/regional_compile.py [--blocks 12] [--steps 20] [--warmup 3] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import os
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


def measure(way: str, blocks: int, steps: int, warmup: int) -> dict[str, Any]:
    """Train in this process; cold = first step, step = median of the timed steps (ms)."""
    import torch
    from torch.nn import functional as F

    import autoopt
    from autoopt.runtime.passes import compile as compile_pass

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

    def step() -> float:
        start = time.perf_counter()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return (time.perf_counter() - start) * 1e3

    cold = step()
    for _ in range(warmup):
        step()
    times = sorted(step() for _ in range(steps))
    result = autoopt.report(model)["compile"]
    return {
        "way": way,
        "cold_ms": cold,
        "step_ms": times[len(times) // 2],
        "compile": f"{result.status.value}: {result.detail}",
        "events": [str(e) for e in result.events],
    }


def run_isolated(way: str, blocks: int, steps: int, warmup: int) -> dict[str, Any]:
    """`measure` in a fresh interpreter with an empty inductor cache (a cold compile)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        code = (
            "import json, benchmarks.regional_compile as b; "
            f"print(json.dumps(b.measure({way!r}, {blocks}, {steps}, {warmup})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    whole = next(r for r in results if r["way"] == "whole")
    eager = next(r for r in results if r["way"] == "eager")
    lines = [
        "| way | cold first step (ms) | vs whole | steady step (ms) | vs whole | vs eager |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['way']} | {r['cold_ms']:.0f} | {r['cold_ms'] / whole['cold_ms']:.2f}x "
            f"| {r['step_ms']:.2f} | {r['step_ms'] / whole['step_ms']:.2f}x "
            f"| {r['step_ms'] / eager['step_ms']:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = parser.parse_args()
    results = []
    for way in WAYS:
        print(f"running {way} ...", file=sys.stderr)
        results.append(run_isolated(way, args.blocks, args.steps, args.warmup))
    print(json.dumps(results, indent=1) if args.json else table(results))
    for r in results:
        print(f"{r['way']}: compile {r['compile']}", file=sys.stderr)


if __name__ == "__main__":
    main()
