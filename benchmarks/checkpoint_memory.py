"""Peak memory of one training step with and without activation checkpointing (as a widely read PyTorch tutorial teaches).

The model is a widely read PyTorch tutorial's deep stack: an `nn.Sequential` of 72 `Linear(1000, 1000)` layers (plain
Linears, no activation in between, as in the seed; `--relu` inserts a ReLU after each), batch
64, one forward and backward on the CPU. Checkpointing is applied by `autoopt.optimize(model,
checkpoint=S)`; "off" is `checkpoint=False`. Each configuration runs in a fresh subprocess so
that peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, which never goes down) belongs to it
alone. Reported per configuration:

* saved activations: bytes autograd keeps for backward after the forward, counted with
  `torch.autograd.graph.saved_tensors_hooks` (each storage once, parameters excluded);
* peak RSS of the process, and its growth over the RSS just before the forward (activations,
  gradients and temporaries of the step; the parameters and torch itself are in the baseline);
* the step time (recomputation makes checkpointed steps slower).

Usage: `python benchmarks/checkpoint_memory.py [--segments off,2,4,8,12] [--batch 64,2048]
[--relu] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

LAYERS = 72
WIDTH = 1000
BATCH = 64
MIB = 1 << 20


def _rss_bytes() -> int:
    """Current resident set size, from /proc (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def measure(segments: int | None, relu: bool, batch: int = BATCH) -> dict[str, Any]:
    """One forward+backward of the deep stack in this process; `segments=None` = no checkpoint."""
    import torch
    from torch import nn

    import autoopt
    from autoopt.runtime.memory import saved_tensor_bytes

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers.append(nn.Linear(WIDTH, WIDTH))
        if relu:
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)
    option: int | bool = segments if segments is not None else False
    model = autoopt.optimize(
        model, device="cpu", amp=False, compile=False, checkpoint=option, verbose=False
    )
    applied = autoopt.report(model)["checkpoint"].status.value
    x = torch.randn(batch, WIDTH)
    baseline = _rss_bytes()
    start = time.perf_counter()
    outputs: list[torch.Tensor] = []
    saved = saved_tensor_bytes(lambda: outputs.append(model(x)))
    outputs[0].sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "batch": batch,
        "segments": "off" if segments is None else segments,
        "checkpoint": applied,
        "saved_activations_mib": saved / MIB,
        "peak_rss_mib": peak / MIB,
        "step_rss_growth_mib": (peak - baseline) / MIB,
        "step_seconds": seconds,
    }


def _child(segments: str, relu: bool, batch: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", segments, "--batch", str(batch)]
    cmd += ["--relu"] if relu else []
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # glibc keeps freed blocks of a few MiB in its heap, so RSS would show memory the program no
    # longer uses; a fixed mmap threshold returns every freed activation to the OS at once and
    # makes peak RSS track the live tensors.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"segments={segments} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a small fixed-width table."""
    head = ("segments", "saved act. MiB", "peak RSS MiB", "step RSS growth MiB", "step s")
    lines = ["{:>8}  {:>14}  {:>12}  {:>19}  {:>6}".format(*head)]
    for r in rows:
        lines.append(
            f"{r['segments']!s:>8}  {r['saved_activations_mib']:>14.1f}  "
            f"{r['peak_rss_mib']:>12.0f}  {r['step_rss_growth_mib']:>19.1f}  "
            f"{r['step_seconds']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", default="off,2,4,8,12", help="comma list; 'off' = none")
    parser.add_argument("--relu", action="store_true", help="a ReLU after every Linear")
    parser.add_argument("--batch", default=str(BATCH), help="comma list of batch sizes")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        segments = None if args.child == "off" else int(args.child)
        print(json.dumps(measure(segments, args.relu, int(args.batch))))
        return 0
    segment_list = [s.strip() for s in args.segments.split(",") if s.strip()]
    kind = "Linear+ReLU" if args.relu else "Linear"
    all_rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        rows = [_child(s, args.relu, batch) for s in segment_list]
        all_rows += rows
        if not args.json:
            print(f"{LAYERS} x {kind}({WIDTH}, {WIDTH}), batch {batch}, one forward+backward, CPU")
            print(table(rows))
            print()
    if args.json:
        print(json.dumps(all_rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
