"""Checkpointing that spends little: GPT-2, Llama and T5 (transformers, random init, no
downloads) trained under `memory_budget` = half of eager's step, against eager.

For each model: eager's step memory (parameters + gradients + AdamW state + the bytes the
forward and loss save for backward, autoopt's counters) sets the budget; then
`optimize(model, optimizer=..., memory_budget=budget, amp=False, compile=False,
channels_last=False)` (with `--defaults`: those left at "auto") plans the checkpointing at its
first step, and:

* speed: eager and planned steps alternate (a burst of load falls on both), `--steps` each
  after `--warmup`, one thread; CPU time per step (the steadier figure on a shared machine) and
  wall time, medians; the ratio eager / planned (>= 0.85 is the goal);
* memory: the step's peak measured by torch's profiler (`diagnostics.measured_memory.step_peak`,
  no code shared with the planner) against the budget, from the state a step begins in (after
  its `zero_grad()`: parameters and AdamW state, no gradients);
* the plan: the report's checkpoint row, its expected step-time cost and the measured one.

Usage: `python -m benchmarks.checkpoint_speed [--models gpt2 llama t5] [--steps 12]
[--fraction 0.5] [--json out.json]`. Prints one line per model and the load average.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import autoopt
from autoopt.diagnostics.measured_memory import step_peak
from autoopt.runtime.memory import format_bytes, saved_tensor_bytes, state_memory

VOCAB, SEQ, BATCH = 512, 128, 8


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=8, n_embd=256, n_head=4, vocab_size=VOCAB, n_positions=SEQ, use_cache=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    return GPT2LMHeadModel(cfg)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=SEQ, use_cache=False,
        attn_implementation="sdpa",
    )  # fmt: skip
    return LlamaForCausalLM(cfg)


def t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        d_model=256, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=4, d_kv=64,
        vocab_size=VOCAB, decoder_start_token_id=0, use_cache=False,
    )  # fmt: skip
    return T5ForConditionalGeneration(cfg)


MODELS: dict[str, Callable[[], nn.Module]] = {"gpt2": gpt2, "llama": llama, "t5": t5}


def batch_of(name: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    if name == "t5":
        return {"input_ids": ids, "labels": torch.randint(1, VOCAB, (BATCH, SEQ // 2), generator=g)}
    return {"input_ids": ids, "labels": ids}


def step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    optimizer.zero_grad()
    model(**batch).loss.backward()
    optimizer.step()


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def run(name: str, fraction: float, steps: int, warmup: int, defaults: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    eager = MODELS[name]()
    planned = copy.deepcopy(eager)
    batches = [batch_of(name, i) for i in range(4)]
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-4)
    opt = torch.optim.AdamW(planned.parameters(), lr=1e-4)
    step(eager, eager_opt, batches[0])  # the state exists, as in a step of the loop
    state = state_memory(eager, eager_opt).state
    activations = saved_tensor_bytes(lambda: eager(**batches[0]).loss)
    budget = int((state + activations) * fraction)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = {} if defaults else {"amp": False, "compile": False, "channels_last": False}
        planned, opt = autoopt.optimize(
            planned, optimizer=opt, memory_budget=budget, verbose=False, **fixed
        )
    times: dict[str, list[tuple[float, float]]] = {"eager": [], "planned": []}
    for i in range(warmup + steps):
        batch = batches[i % len(batches)]
        for label, model, optimizer in (("eager", eager, eager_opt), ("planned", planned, opt)):
            measured = timed(lambda m=model, o=optimizer, b=batch: step(m, o, b))
            if i >= warmup:
                times[label].append(measured)
    # Each step begins with zero_grad(set_to_none=True): done before measuring, so the
    # gradients it frees (unseen by the profiler) are not counted as well as the new ones.
    eager_opt.zero_grad(set_to_none=True)
    opt.zero_grad(set_to_none=True)
    peaks = {
        "eager": step_peak(eager, eager_opt, lambda: step(eager, eager_opt, batches[0])),
        "planned": step_peak(planned, opt, lambda: step(planned, opt, batches[0])),
    }
    cpu = {k: statistics.median(c for c, _ in v) for k, v in times.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in times.items()}
    report = autoopt.report(planned)
    row = report["checkpoint"]
    return {
        "model": name,
        "budget": budget,
        "eager step bytes": state + activations,
        "eager peak": peaks["eager"],
        "planned peak": peaks["planned"],
        "under budget": peaks["planned"] <= budget,
        "eager cpu ms": round(cpu["eager"] * 1000, 1),
        "planned cpu ms": round(cpu["planned"] * 1000, 1),
        "speed (cpu)": round(cpu["eager"] / cpu["planned"], 3),
        "amp": report["amp"].status.value,
        "applied": report.applied(),
        "speed (wall)": round(wall["eager"] / wall["planned"], 3),
        "plan": row.detail,
        "figures": row.figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--defaults", action="store_true", help="optimize()'s other options at their defaults"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        row = run(name, args.fraction, args.steps, args.warmup, args.defaults)
        rows.append(row)
        print(
            f"{name}: {row['speed (cpu)']:.2f}x eager by CPU ({row['eager cpu ms']} vs "
            f"{row['planned cpu ms']} ms), {row['speed (wall)']:.2f}x by wall; peak "
            f"{format_bytes(row['planned peak'])} for a budget of {format_bytes(row['budget'])} "
            f"(eager {format_bytes(row['eager peak'])}); applied: {', '.join(row['applied'])}; "
            f"{row['plan']}",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1, default=str)


if __name__ == "__main__":
    main()
