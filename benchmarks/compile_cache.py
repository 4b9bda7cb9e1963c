"""Time to the first training step of a compiled model in two fresh processes: cold, then warm.

    .venv/bin/python -m benchmarks.compile_cache --workload cnn --cache torch
    .venv/bin/python -m benchmarks.compile_cache --workload transformer --cache autoopt

`--cache torch`: both processes share one new TORCHINDUCTOR_CACHE_DIR, so the second one reads
torch's own local caches (FX graph cache, AOTAutograd cache). `--cache autoopt`: each process
gets a new, empty TORCHINDUCTOR_CACHE_DIR (a restart on another node, a cleaned /tmp), and
they share one `optimize(compile_cache=DIR)`. `--cache autoopt-home`: no TORCHINDUCTOR_CACHE_DIR
at all, one shared `compile_cache=DIR`, where autoopt then keeps torch's local caches too (the
default experience after /tmp was cleaned). `--cache none`: new inductor cache dirs, no
autoopt cache (two cold runs). Figures are CPU time of the child (user + system, its g++
children included: TORCHINDUCTOR_COMPILE_THREADS=1), and wall time; see docs/benchmarks/compile.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def child(workload: str, cache: str | None) -> None:
    """One process: build, optimize(compile=True), time the first training step; the process's
    CPU time (its g++ children too) after the imports, after optimize() and after that step."""
    import torch
    from torch import nn

    import autoopt

    cpu_imported = cpu_so_far()

    torch.manual_seed(0)
    if workload == "cnn":
        model: nn.Module = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(16, 10),
        )  # fmt: skip
        x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    else:
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        model = nn.Sequential(
            nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            nn.Flatten(),
            nn.Linear(64 * 32, 10),
        )
        x, y = torch.randn(8, 32, 64), torch.randint(0, 10, (8,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = autoopt.optimize(
        model, optimizer=optimizer, compile=True, amp=False, verbose=False,
        compile_cache=cache if cache else False,
    )  # fmt: skip
    cpu_optimized = cpu_so_far()
    start = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    wall = time.perf_counter() - start
    cpu_stepped = cpu_so_far()
    result = autoopt.report(model)["compile"]
    cpu = {
        "imports": cpu_imported,
        "optimize()": cpu_optimized - cpu_imported,
        "first step": cpu_stepped - cpu_optimized,
        "to first step": cpu_stepped,  # from the process's start (interpreter start-up too)
    }
    print(
        json.dumps(
            {
                "first step wall s": wall,
                "cpu s": {k: round(v, 2) for k, v in cpu.items()},
                "detail": result.detail,
            }
        )
    )


def cpu_so_far() -> float:
    """This process's CPU time so far, its finished children's included."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + cpu_of_children()


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("cnn", "transformer"), default="cnn")
    parser.add_argument(
        "--cache", choices=("torch", "autoopt", "autoopt-home", "none"), default="torch"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.workload, args.dir)
        return
    shared_inductor = tempfile.mkdtemp(prefix="ao-inductor-")
    autoopt_cache = tempfile.mkdtemp(prefix="ao-compile-cache-")
    for run in ("cold", "warm"):
        env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1")
        env["TORCHINDUCTOR_CACHE_DIR"] = (
            shared_inductor if args.cache == "torch" else tempfile.mkdtemp(prefix="ao-inductor-")
        )
        if args.cache == "autoopt-home":  # no inductor dir chosen: autoopt keeps torch's there
            del env["TORCHINDUCTOR_CACHE_DIR"]
        command = [sys.executable, "-m", "benchmarks.compile_cache", "--child"]
        command += ["--workload", args.workload]
        if args.cache.startswith("autoopt"):
            command += ["--dir", autoopt_cache]
        before, start = cpu_of_children(), time.perf_counter()
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        cpu, wall = cpu_of_children() - before, time.perf_counter() - start
        last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
        row = {"workload": args.workload, "cache": args.cache, "run": run}
        row.update({"process cpu s": round(cpu, 1), "process wall s": round(wall, 1)})
        try:
            row.update(json.loads(last))
        except json.JSONDecodeError:
            row["error"] = last
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
