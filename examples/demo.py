"""The autoopt demo: the three faces of the tool on the bundled examples.

1. optimize(): the CNN and transformer-LM examples, trained with and without the one added
   line side by side (their timed blocks take turns), with autoopt's report and the speed-up
   by wall and by CPU time.
2. lint: what `autoopt lint` finds in the naive training scripts of examples/naive/.
3. rewrite: the diff `autoopt rewrite --diff` proposes for one of them.

Run it with `make demo` (which bootstraps the environment first).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cnn  # noqa: E402
import transformer_lm  # noqa: E402


def banner(title: str) -> None:
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}", flush=True)


def run_cli(*args: str) -> int:
    cmd = [sys.executable, "-m", "autoopt", *args]
    print("$ autoopt " + " ".join(args), flush=True)
    return subprocess.run(cmd, cwd=HERE.parent).returncode


def side_by_side(name: str, example: object, batch_size: int, blocks: int = 5, steps: int = 6) -> None:
    """Eager and autoopt trained side by side: after the warm-up, their timed blocks take turns,
    so load from other programs falls on both alike; wall and CPU time per step, with spread."""
    eager = example.Session(False, batch_size)
    print(f"\n[{name}] autoopt report:", flush=True)
    fast = example.Session(True, batch_size)
    for run in (eager, fast):
        run.steps(example.WARMUP)
    # (the decisions autoopt measured on those first steps were logged as they were made)
    wall: dict[str, list[float]] = {"eager": [], "autoopt": []}
    cpu: dict[str, list[float]] = {"eager": [], "autoopt": []}
    for _ in range(blocks):
        for label, run in (("eager", eager), ("autoopt", fast)):
            w0, c0 = time.perf_counter(), time.process_time()
            run.steps(steps)
            wall[label].append((time.perf_counter() - w0) / steps)
            cpu[label].append((time.process_time() - c0) / steps)
    ratios = sorted(e / a for e, a in zip(wall["eager"], wall["autoopt"], strict=True))
    median = statistics.median
    print(
        f"[{name}] eager {median(wall['eager']) * 1000:.1f} ms/step, "
        f"autoopt {median(wall['autoopt']) * 1000:.1f} ms/step -> "
        f"{median(ratios):.2f}x faster (blocks {ratios[0]:.2f}x-{ratios[-1]:.2f}x; "
        f"by CPU time {median(cpu['eager']) / median(cpu['autoopt']):.2f}x); "
        f"loss {fast.losses[0]:.3f} -> {fast.losses[-1]:.3f}"
    )
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load > cores:
        print(
            f"[{name}] warning: the machine is busy (load {load:.1f} on {cores} cores): "
            "wall-clock ratios move with it; the CPU-time ratio is the steadier figure"
        )


def main() -> None:
    banner("1. autoopt.optimize(model, loader, optimizer): one added line, the loop unchanged")
    side_by_side("cnn", cnn, 64)
    side_by_side("transformer_lm", transformer_lm, 32)

    banner("2. autoopt lint examples/naive: what the naive scripts leave on the table")
    run_cli("lint", "--no-cache", "examples/naive")

    banner("3. autoopt rewrite --diff: the fixes, as a diff (nothing is written)")
    run_cli("rewrite", "--diff", "--unsafe-fixes", "examples/naive/cnn_train.py")


if __name__ == "__main__":
    main()
