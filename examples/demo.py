"""The autoopt demo: the three faces of the tool on the bundled examples.

1. optimize(): the CNN and transformer-LM examples, trained with and without the one added
   line, side by side, with autoopt's report and the measured speed-up.
2. lint: what `autoopt lint` finds in the naive training scripts of examples/naive/.
3. rewrite: the diff `autoopt rewrite --diff` proposes for one of them.

Run it with `make demo` (which bootstraps the environment first).
"""

from __future__ import annotations

import subprocess
import sys
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


def main() -> None:
    banner("1. autoopt.optimize(model, loader, optimizer): one added line, the loop unchanged")
    for name, example, steps in (("cnn", cnn, 30), ("transformer_lm", transformer_lm, 30)):
        eager = example.train(False, steps, 64 if name == "cnn" else 32)
        print(f"\n[{name}] autoopt report:")
        fast = example.train(True, steps, 64 if name == "cnn" else 32)
        for pass_name, detail in fast["decided"].items():
            print(f"[{name}] after the first steps, {pass_name}: {detail}")
        print(
            f"[{name}] eager {eager['steps_per_s']:.2f} steps/s, "
            f"autoopt {fast['steps_per_s']:.2f} steps/s -> "
            f"{fast['steps_per_s'] / eager['steps_per_s']:.2f}x; "
            f"loss {fast['first_loss']:.3f} -> {fast['last_loss']:.3f}"
        )

    banner("2. autoopt lint examples/naive: what the naive scripts leave on the table")
    run_cli("lint", "--no-cache", "examples/naive")

    banner("3. autoopt rewrite --diff: the fixes, as a diff (nothing is written)")
    run_cli("rewrite", "--diff", "--unsafe-fixes", "examples/naive/cnn_train.py")


if __name__ == "__main__":
    main()
