"""Model zoo: eager vs `autoopt.optimize()` with defaults on real architectures, side by side.

    python -m benchmarks.model_zoo            # the whole zoo
    python -m benchmarks.model_zoo --quick    # three models, fewer blocks (a smoke run)
    python -m benchmarks.model_zoo --models llama t5 --compile   # with compile=True as well

Models: small-config, random-init Hugging Face `transformers` models (GPT-2, BERT, Llama, T5,
ViT, ResNet, ConvNeXt, MobileNetV2; no downloads) and the repo's own CNN workload. Each model
trains with AdamW in every configuration of one process: plain eager, `optimize()` defaults, and
defaults with one option turned off at a time (`amp=False`, `channels_last=False`), which says
what each measured pass earns (`amp=False` keeps eager's kernels: compile, channels-last and a
fused optimizer step stand down with amp there). The configurations run in interleaved blocks (each block: a few
steps of each configuration in turn, on the same batches), so a burst of load from other
processes falls on every configuration alike; the figure per configuration is the median block,
by wall time and by CPU time (this process's user+system time, which other processes' load
disturbs less). The first step and the first FIRST_STEPS steps (optimize()'s trials run on
them, one candidate configuration per step) are timed on their own, against eager's. Results go to stdout as a Markdown table (`--out` writes a file too).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import autoopt

SEED = 0


@dataclass
class ZooModel:
    """A model builder and a batch builder (keyword arguments of its forward, with labels)."""

    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], dict[str, torch.Tensor]]


def _tokens(batch: int, length: int, vocab: int) -> Callable[[torch.Generator], dict[str, Any]]:
    def make(g: torch.Generator) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (batch, length), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}

    return make


def _classify(batch: int, length: int, vocab: int) -> Callable[[torch.Generator], dict[str, Any]]:
    def make(g: torch.Generator) -> dict[str, Any]:
        ids = torch.randint(0, vocab, (batch, length), generator=g)
        return {"input_ids": ids, "labels": torch.randint(0, 2, (batch,), generator=g)}

    return make


def _images(batch: int, size: int, classes: int = 10) -> Callable[[torch.Generator], dict]:
    def make(g: torch.Generator) -> dict[str, Any]:
        x = torch.randn(batch, 3, size, size, generator=g)
        return {"pixel_values": x, "labels": torch.randint(0, classes, (batch,), generator=g)}

    return make


def _t5_batch(g: torch.Generator) -> dict[str, Any]:
    return {
        "input_ids": torch.randint(0, 1000, (8, 64), generator=g),
        "labels": torch.randint(0, 1000, (8, 16), generator=g),
    }


class _Workload(nn.Module):
    """`autoopt bench`'s CNN (autoopt/diagnostics/bench/workloads.py), with an HF-style loss
    output."""

    def __init__(self) -> None:
        super().__init__()
        from autoopt.diagnostics.bench.workloads import SmallCNN

        self.net = SmallCNN()

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        return {"loss": nn.functional.cross_entropy(self.net(pixel_values), labels)}


def zoo() -> list[ZooModel]:
    """The zoo, small configs (a training step in tens of milliseconds on one CPU core)."""
    import transformers as tf

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    small |= {"intermediate_size": 128}
    vision = {"hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1], "num_labels": 10}
    return [
        ZooModel(
            "gpt2",
            lambda: tf.GPT2LMHeadModel(
                tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
            ),
            _tokens(8, 64, 1000),
        ),
        ZooModel(
            "bert",
            lambda: tf.BertForSequenceClassification(tf.BertConfig(vocab_size=1000, **small)),
            _classify(8, 64, 1000),
        ),
        ZooModel(
            "llama",
            lambda: tf.LlamaForCausalLM(
                tf.LlamaConfig(vocab_size=1000, num_key_value_heads=2, **small)
            ),
            _tokens(8, 64, 1000),
        ),
        ZooModel(
            "t5",
            lambda: tf.T5ForConditionalGeneration(
                tf.T5Config(
                    vocab_size=1000,
                    d_model=64,
                    d_ff=128,
                    d_kv=16,
                    num_layers=2,
                    num_heads=4,
                    decoder_start_token_id=0,
                    pad_token_id=0,
                )
            ),
            _t5_batch,
        ),
        ZooModel(
            "vit",
            lambda: tf.ViTForImageClassification(
                tf.ViTConfig(image_size=32, patch_size=4, num_labels=10, **small)
            ),
            _images(8, 32),
        ),
        ZooModel(
            "resnet",
            lambda: tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=16, **vision)),
            _images(8, 64),
        ),
        ZooModel(
            "convnext",
            lambda: tf.ConvNextForImageClassification(tf.ConvNextConfig(**vision)),
            _images(8, 64),
        ),
        ZooModel(
            "mobilenet_v2",
            lambda: tf.MobileNetV2ForImageClassification(
                tf.MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10)
            ),
            _images(8, 64),
        ),
        ZooModel("workload_cnn", _Workload, _images(16, 32)),
    ]


QUICK = ("gpt2", "resnet", "workload_cnn")

# name -> optimize() options (None: plain eager).
CONFIGS: dict[str, dict[str, Any] | None] = {
    "eager": None,
    "defaults": {},
    "amp=False": {"amp": False},
    "channels_last=False": {"channels_last": False},
}
# With --compile: compile=True with amp measured through it, and compile in fp32 for reference.
COMPILE_CONFIGS: dict[str, dict[str, Any] | None] = {
    "compile=True": {"compile": True},
    "compile=True, amp=False": {"compile": True, "amp": False},
}


@dataclass
class Run:
    """One configuration of one model: its model, optimizer, and the times measured."""

    name: str
    model: nn.Module
    opt: torch.optim.Optimizer
    first_s: float = 0.0
    first_steps_s: float = 0.0  # the first FIRST_STEPS steps, the first one included
    first_cpu_s: float = 0.0  # the same two, by this process's CPU time
    first_steps_cpu_s: float = 0.0
    wall: list[float] = field(default_factory=list)  # per step, per block
    cpu: list[float] = field(default_factory=list)
    report: str = ""


def _step(run: Run, batch: dict[str, Any]) -> None:
    run.opt.zero_grad(set_to_none=True)
    out = run.model(**batch)
    loss = out["loss"] if isinstance(out, dict) else out.loss
    loss.backward()
    run.opt.step()


# The first steps timed as a whole: the measured choices (layout, amp: up to 9 steps) and the
# optimizer step timing (steps 2-10) are decided within them, so the blocks after them measure
# the settled configuration.
FIRST_STEPS = 12


def _make(entry: ZooModel, name: str, options: dict[str, Any] | None) -> Run:
    torch.manual_seed(SEED)
    model = entry.build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if options is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, opt = autoopt.optimize(model, optimizer=opt, verbose=False, **options)
    return Run(name, model, opt)


def _decisions(run: Run) -> str:
    """What optimize() kept, in a few words per measured pass."""
    report = autoopt.report(run.model)
    words = []
    for name in ("channels_last", "amp"):
        result = report[name]
        words.append(f"{name}: {result.status.value}")
    backends = report["backends"].detail
    chosen = next((w for w in ("fused", "foreach", "default") if f"; {w} " in backends), "?")
    words.append(f"step: {chosen}")
    return ", ".join(words)


def bench_model(
    entry: ZooModel, blocks: int, steps: int, configs: dict[str, dict[str, Any] | None]
) -> dict[str, Any]:
    """Every configuration of one model, interleaved; medians per configuration."""
    g = torch.Generator().manual_seed(SEED + 1)
    data = [entry.batch(g) for _ in range(4)]
    # One untimed step of a throwaway eager copy first: the process's own first-call costs
    # (kernels, allocator) would otherwise fall on whichever configuration ran first (eager).
    _step(_make(entry, "warm-up", None), data[0])
    runs = [_make(entry, name, options) for name, options in configs.items()]
    for run in runs:  # the first steps: optimize()'s trials run on them, one step each
        start, cpu = time.perf_counter(), time.process_time()
        _step(run, data[0])
        run.first_s = time.perf_counter() - start
        run.first_cpu_s = time.process_time() - cpu
        for i in range(1, FIRST_STEPS):
            _step(run, data[i % len(data)])
        run.first_steps_s = time.perf_counter() - start
        run.first_steps_cpu_s = time.process_time() - cpu
    for _ in range(blocks):
        for run in runs:
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(steps):
                _step(run, data[i % len(data)])
            run.wall.append((time.perf_counter() - wall) / steps)
            run.cpu.append((time.process_time() - cpu) / steps)
    for run in runs[1:]:
        run.report = _decisions(run)
    eager = runs[0]
    result: dict[str, Any] = {"model": entry.name, "configs": {}}
    for run in runs:
        wall, cpu = statistics.median(run.wall), statistics.median(run.cpu)
        result["configs"][run.name] = {
            "wall_ms": wall * 1000,
            "cpu_ms": cpu * 1000,
            "speedup_wall": statistics.median(eager.wall) / wall,
            "speedup_cpu": statistics.median(eager.cpu) / cpu,
            "first_step_s": run.first_s,
            "first_vs_eager": run.first_s / eager.first_s,
            "first_steps_s": run.first_steps_s,
            "first_steps_vs_eager": run.first_steps_s / eager.first_steps_s,
            "first_cpu_vs_eager": run.first_cpu_s / eager.first_cpu_s,
            "first_steps_cpu_vs_eager": run.first_steps_cpu_s / eager.first_steps_cpu_s,
            "kept": run.report,
        }
    return result


def table(results: list[dict[str, Any]]) -> str:
    """The results as Markdown: one row per model and configuration."""
    lines = [
        "| model | config | step wall ms | speedup (wall) | step CPU ms | speedup (CPU) "
        f"| first step s (x eager's) | CPU x eager's | first {FIRST_STEPS} steps s (x eager's) "
        "| CPU x eager's | optimize() kept |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        for name, c in result["configs"].items():
            lines.append(
                f"| {result['model']} | {name} | {c['wall_ms']:.1f} | {c['speedup_wall']:.2f}x "
                f"| {c['cpu_ms']:.1f} | {c['speedup_cpu']:.2f}x | {c['first_step_s']:.2f} "
                f"({c['first_vs_eager']:.1f}x) | {c['first_cpu_vs_eager']:.1f}x "
                f"| {c['first_steps_s']:.2f} ({c['first_steps_vs_eager']:.1f}x) "
                f"| {c['first_steps_cpu_vs_eager']:.1f}x | {c['kept']} |"
            )
    return "\n".join(lines)


def machine() -> str:
    """The machine, torch and thread count, in one line."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads, Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the zoo and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--models", nargs="*", help="model names to run (default: all)")
    parser.add_argument("--blocks", type=int, default=None, help="interleaved blocks")
    parser.add_argument("--steps", type=int, default=3, help="steps per block")
    parser.add_argument(
        "--compile", action="store_true", help="add compile=True configurations (slow)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", help="also write the Markdown table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    entries = zoo()
    wanted = args.models or (list(QUICK) if args.quick else None)
    if wanted:
        entries = [e for e in entries if e.name in wanted]
    blocks = args.blocks or (3 if args.quick else 7)
    results = []
    for entry in entries:
        print(f"{entry.name} ...", file=sys.stderr, flush=True)
        configs = {**CONFIGS, **(COMPILE_CONFIGS if args.compile else {})}
        results.append(bench_model(entry, blocks, args.steps, configs))
    text = f"Machine: {machine()}\n\n{table(results)}\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
