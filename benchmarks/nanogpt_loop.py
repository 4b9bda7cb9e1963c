"""`optimize()` on code nobody here wrote: nanoGPT's `model.py` (karpathy/nanoGPT at the corpus
manifest's pinned commit, fetched by `benchmarks/corpus/fetch.py`, never vendored) trained by a
nanoGPT-style loop with the extras real loops have: an EMA copy (`AveragedModel`), a cosine LR
scheduler, gradient clipping, `zero_grad(set_to_none=True)`, and a resume halfway through from
the model, optimizer and scheduler `state_dict`s into fresh objects.

The same loop runs twice on the same batches and dropout seeds: in plain torch, and after
`autoopt.optimize(model, optimizer=opt, amp=False, compile=False, memory_budget=budget)` with
budget = parameters + gradients + AdamW state + a third of eager's saved activations, so that
`checkpoint="auto"` checkpoints the transformer blocks. Printed: the checkpoint plan, the largest
relative loss difference, and the largest parameter and EMA differences after the run (the
optimizer step implementation autoopt picks differs from torch's default loop in fp32 rounding
only). Then `amp="auto"`'s first forward: the plan's "before" activations must be those of the
precision the trial kept (the trial forwards are not counted).

Usage: `python -m benchmarks.nanogpt_loop [--root benchmarks/corpus/_repos] [--layers 6]`.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import autoopt
from autoopt.runtime.memory import state_memory

DEFAULT_ROOT = Path(__file__).parent / "corpus" / "_repos"
BATCHES = 8
VOCAB = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="fetched corpus")
    parser.add_argument("--layers", type=int, default=6, help="transformer blocks")
    args = parser.parse_args()
    repo = args.root / "karpathy+nanoGPT"
    if not (repo / "model.py").exists():
        sys.exit(f"{repo}/model.py not found: run `python benchmarks/corpus/fetch.py` first")
    sys.path.insert(0, str(repo))
    from model import GPT, GPTConfig  # nanoGPT's own module

    config = GPTConfig(
        block_size=64, vocab_size=VOCAB, n_layer=args.layers, n_head=4, n_embd=128, dropout=0.1
    )
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, VOCAB, (8, 65), generator=gen) for _ in range(BATCHES)]
    pairs = [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in data]

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        torch.manual_seed(0)
        model = GPT(config)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        return model, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=BATCHES)

    model, opt, _ = make()
    eager = autoopt.explain_memory(model, pairs[0], memory_budget=None, amp=False)
    budget = state_memory(model, opt).state + eager.memory.before.activations // 3

    plain = _train(make, pairs, None)
    ours = _train(make, pairs, budget)
    print(f"budget {budget:,} B (state + a third of eager's {eager.memory.before.activations:,} B)")
    print(f"checkpoint: {autoopt.report(ours['first'])['checkpoint'].detail}")
    loss_diff = max(
        abs(a - b) / abs(b) for a, b in zip(ours["losses"], plain["losses"], strict=True)
    )
    print(f"max relative loss difference over {BATCHES} steps: {loss_diff:.2e}")
    print(f"max parameter difference: {_max_diff(ours['state'], plain['state']):.2e}")
    print(f"max EMA difference: {_max_diff(ours['ema'], plain['ema']):.2e}")

    model, opt, _ = make()
    model, opt = autoopt.optimize(
        model, optimizer=opt, compile=False, memory_budget=budget, verbose=False
    )
    model(*pairs[0])
    report = autoopt.report(model)
    kept = "bf16" if report["amp"].status.value == "applied" else False
    expected = autoopt.explain_memory(make()[0], pairs[0], memory_budget=None, amp=kept)
    assert report.memory is not None
    print(
        f"amp='auto' kept {kept or 'fp32'}: plan's activations before "
        f"{report.memory.before.activations:,} B, that precision's eager forward "
        f"{expected.memory.before.activations:,} B"
    )


def _train(make: Any, pairs: list, budget: int | None) -> dict[str, Any]:
    """The loop, half, a resume into fresh objects, the other half; `budget` None: plain torch."""

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
        model, opt, sched = make()
        if budget is not None:
            model, opt = autoopt.optimize(
                model, optimizer=opt, amp=False, compile=False, memory_budget=budget, verbose=False
            )
        return model, opt, sched

    first, opt, sched = build()
    ema = AveragedModel(first, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    torch.manual_seed(1)
    half = len(pairs) // 2
    losses = _steps(first, opt, sched, ema, pairs[:half])
    saved = copy.deepcopy(
        {"model": first.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    )
    model, opt, sched = make()  # resume: load into fresh objects, then optimize them
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    if budget is not None:
        model, opt = autoopt.optimize(
            model, optimizer=opt, amp=False, compile=False, memory_budget=budget, verbose=False
        )
    losses += _steps(model, opt, sched, ema, pairs[half:])
    return {"losses": losses, "state": model.state_dict(), "ema": ema.state_dict(), "first": first}


def _steps(model: Any, opt: Any, sched: Any, ema: AveragedModel, pairs: list) -> list[float]:
    losses = []
    for x, y in pairs:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        ema.update_parameters(model)
        losses.append(loss.item())
    return losses


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(
        (a[k].float() - b[k].float()).abs().max().item() for k in b if b[k].is_floating_point()
    )


if __name__ == "__main__":
    main()
