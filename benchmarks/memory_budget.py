"""`checkpoint="auto"` under a memory budget on a 12-block GPT (layers in an `nn.ModuleList`).

The model: token + position embeddings, 12 pre-norm transformer blocks (width 256, 4 heads,
dropout 0.1) in an `nn.ModuleList` called by the parent's forward with an attention mask, a
tied head; batch 8 x 128 tokens, cross-entropy loss, AdamW, fp32 on the CPU (saved-activation
bytes are exact on any device).

For each budget = parameters + gradients + AdamW state + a fraction of eager's saved-activation
bytes, `autoopt.optimize(..., memory_budget=budget, amp=False, compile=False,
channels_last=False)` plans the checkpointing, and:

* the step's memory: state + the saved bytes of the planned forward, measured with
  `saved_tensor_bytes` (autograd's saved tensors plus the selective checkpoints' caches),
  checked against the budget;
* the gradients of the first step (which measures) against eager's, with the same dropout
  seeds (fp32, max abs difference <= 1e-6);
* the step time against eager, measured side by side (eager and planned steps alternate), the
  median of `--steps` steps after warm-up, one thread.

The gate (`--check`): at a third of eager's activations the step fits and step time <= 1.35x.
Writes a markdown table (stdout, or `--markdown`) and, with matplotlib, a plot (`--plot`).

Usage: `python -m benchmarks.memory_budget [--steps 15] [--markdown out.md] [--plot out.png]
[--check]`.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import autoopt
from autoopt.runtime.checkpointing.checkpoint_plan import memory_plan
from autoopt.runtime.memory import format_bytes, saved_tensor_bytes, state_memory

LAYERS, WIDTH, HEADS, VOCAB, SEQ, BATCH = 12, 256, 4, 512, 128, 8
FRACTIONS = (1.0, 0.75, 0.5, 1 / 3, 0.2, 0.1)
GATE_FRACTION, GATE_RATIO = 1 / 3, 1.35


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP, both residual (as nanoGPT's)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx) + self.pos(torch.arange(t))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def example() -> torch.Tensor:
    """A batch of token ids, for `autoopt doctor --input benchmarks.memory_budget:example`."""
    return _batch(0)[0]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> float:
    """One training step; returns its seconds. Dropout is seeded per step."""
    x, y = _batch(seed)
    start = time.perf_counter()
    torch.manual_seed(seed)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start


def _first_grads(model: nn.Module) -> list[torch.Tensor]:
    x, y = _batch(0)
    torch.manual_seed(0)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return grads


def measure(fraction: float, steps: int) -> dict[str, object]:
    torch.manual_seed(0)
    eager = GPT()
    x, _ = _batch(0)
    state = state_memory(eager, torch.optim.AdamW(eager.parameters())).state
    eager_saved = saved_tensor_bytes(lambda: eager(x))
    budget = state + int(fraction * eager_saved)
    planned = copy.deepcopy(eager)
    opt = torch.optim.AdamW(planned.parameters(), lr=1e-4)
    planned, opt = autoopt.optimize(
        planned,
        None,
        opt,
        amp=False,
        compile=False,
        channels_last=False,
        memory_budget=budget,
        verbose=False,
    )
    expected, got = _first_grads(eager), _first_grads(planned)  # the planned one measures here
    grad_diff = max((e - g).abs().max().item() for e, g in zip(expected, got, strict=True))
    plan = memory_plan(planned)
    assert plan is not None
    torch.manual_seed(0)
    saved = saved_tensor_bytes(lambda: planned(x))
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-4)
    times: dict[str, list[float]] = {"eager": [], "planned": []}
    for i in range(steps + 3):
        for name, model, optimizer in (("eager", eager, eager_opt), ("planned", planned, opt)):
            seconds = _step(model, optimizer, seed=i)
            if i >= 3:
                times[name].append(seconds)
    eager_s, planned_s = (statistics.median(times[k]) for k in ("eager", "planned"))
    return {
        "fraction": fraction,
        "budget": budget,
        "step_bytes": state + saved,
        "predicted": plan.after.total,
        "eager_saved": eager_saved,
        "saved": saved,
        "blocks": plan.blocks() or "none",
        "fits": state + saved <= budget,
        "grad_diff": grad_diff,
        "eager_ms": eager_s * 1e3,
        "planned_ms": planned_s * 1e3,
        "ratio": planned_s / eager_s,
    }


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| activations allowed | budget | step holds | fits | checkpointed blocks | saved "
        "activations | max grad diff | step ms (eager) | step ms | x eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['fraction']:.2f} | {format_bytes(r['budget'])} | "
            f"{format_bytes(r['step_bytes'])} | {'yes' if r['fits'] else 'no'} | {r['blocks']} | "
            f"{format_bytes(r['eager_saved'])} -> {format_bytes(r['saved'])} | "
            f"{r['grad_diff']:.1e} | {r['eager_ms']:.1f} | {r['planned_ms']:.1f} | "
            f"{r['ratio']:.2f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, object]], path: str) -> bool:
    """Budget vs step time; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    budgets = [r["budget"] / 2**20 for r in rows]
    ax.plot(budgets, [r["planned_ms"] for r in rows], "o-", label='checkpoint="auto"')
    ax.plot(budgets, [r["eager_ms"] for r in rows], "s--", label="eager (no limit)")
    for r, b in zip(rows, budgets, strict=True):
        ax.annotate(f"{r['fraction']:.2f}", (b, r["planned_ms"]), fontsize=7)
    ax.set_xlabel("memory budget (MiB): state + fraction of eager's activations")
    ax.set_ylabel("step time (ms, median)")
    ax.set_title(f"{LAYERS}-block GPT, CPU fp32, batch {BATCH}x{SEQ}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--markdown")
    parser.add_argument("--plot")
    parser.add_argument("--check", action="store_true", help="fail unless the gate holds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for fraction in FRACTIONS:
        rows.append(measure(fraction, args.steps))
        print(f"fraction {fraction:.2f}: x{rows[-1]['ratio']:.2f}", file=sys.stderr)
    table = markdown(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(table + "\n")
    if args.plot and not plot(rows, args.plot):
        print("matplotlib is not installed: no plot", file=sys.stderr)
    gate = next(r for r in rows if r["fraction"] == GATE_FRACTION)
    ok = gate["fits"] and gate["grad_diff"] <= 1e-6 and gate["ratio"] <= GATE_RATIO
    ok = ok and all(r["grad_diff"] <= 1e-6 for r in rows)
    print(f"gate (a third of eager's activations): {'pass' if ok else 'FAIL'}", file=sys.stderr)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
