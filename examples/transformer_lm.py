"""A small transformer language model on synthetic tokens, trained by a plain loop plus one
autoopt line.

    python examples/transformer_lm.py                 # with autoopt.optimize()
    python examples/transformer_lm.py --no-optimize   # the same loop without it
    python examples/transformer_lm.py --compare       # both, side by side, and the speed-up
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import autoopt

VOCAB, SEQ = 256, 64


class TinyTransformerLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, SEQ, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.out = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        h = self.encoder(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]], is_causal=True)
        return self.out(h)


def synthetic_tokens(n: int, seed: int = 0) -> TensorDataset:
    """Sequences that follow t[i+1] = (3 * t[i] + 1) mod VOCAB from a random start: learnable."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, VOCAB, (n, 1), generator=g)
    seq = [start]
    for _ in range(SEQ):
        seq.append((3 * seq[-1] + 1) % VOCAB)
    tokens = torch.cat(seq, 1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class Session:
    """One training run of the loop below, stepped on demand (the demo times two side by side)."""

    def __init__(self, use_autoopt: bool, batch_size: int, verbose: bool = True) -> None:
        torch.manual_seed(0)
        model = TinyTransformerLM()
        loader = DataLoader(synthetic_tokens(batch_size * 16), batch_size=batch_size, shuffle=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if use_autoopt:
            model, loader, optimizer = autoopt.optimize(model, loader, optimizer, verbose=verbose)
        self.model, self.loader, self.optimizer = model, loader, optimizer
        self.loss_fn = nn.CrossEntropyLoss()
        self.losses: list[float] = []
        self.model.train()
        self._batches = iter(())

    def _next(self) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):
            try:
                return next(self._batches)
            except StopIteration:
                self._batches = iter(self.loader)  # a new epoch
        raise RuntimeError("the loader is empty")

    def steps(self, n: int) -> None:
        """`n` steps of the user's loop, unchanged."""
        model, optimizer, loss_fn = self.model, self.optimizer, self.loss_fn
        for _ in range(n):
            x, y = self._next()
            optimizer.zero_grad()
            logits = model(x)
            loss = loss_fn(logits.reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            self.losses.append(loss.item())

    def decided(self) -> dict[str, str]:
        """What optimize() decided on the first steps (backends, channels_last, amp)."""
        report = autoopt.report(self.model)
        return {p: report[p].detail for p in ("backends", "channels_last", "amp")}


# 10 warm-up steps: optimize() times its optimizer step over the first 10 on CPU.
WARMUP = 10


def train(use_autoopt: bool, steps: int, batch_size: int, verbose: bool = True) -> dict:
    """Train for `steps` batches; returns steps/s (warm-up excluded), first/last loss and, with
    autoopt, the decisions it took on the first steps (report lines of backends, channels_last,
    amp)."""
    run = Session(use_autoopt, batch_size, verbose)
    run.steps(WARMUP)
    start = time.perf_counter()
    run.steps(steps)
    elapsed = time.perf_counter() - start
    result = {"steps_per_s": steps / elapsed, "first_loss": run.losses[0], "last_loss": run.losses[-1]}
    if use_autoopt:
        result["decided"] = run.decided()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--no-optimize", action="store_true", help="run the loop without autoopt")
    mode.add_argument("--compare", action="store_true", help="run both ways and compare")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    runs = [False, True] if args.compare else [not args.no_optimize]
    results = {}
    for use in runs:
        r = train(use, args.steps, args.batch_size)
        label = "autoopt" if use else "eager"
        results[label] = r
        print(f"transformer_lm {label:>7}: {r['steps_per_s']:7.2f} steps/s  "
              f"loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")
    if args.compare:
        ratio = results["autoopt"]["steps_per_s"] / results["eager"]["steps_per_s"]
        print(f"transformer_lm speed-up: {ratio:.2f}x")


if __name__ == "__main__":
    main()
