"""The real-size bench of the quick GPU check: the four workloads of `models` (GPT-2 small,
ResNet-50, ResNet-18, a 6-layer encoder) under every configuration a user compares, in one
process, under one time budget.

Configurations, most important first: eager fp32 (PyTorch's defaults: TF32 matmuls off), the
user's loop through `autoopt.optimize()`, eager bf16 (`torch.autocast` by the user), then
`torch.compile` (default mode, fp32), Accelerate bf16, `optimize(tune=True)` and
pytorch-autotune (its search under `Settings.search_s`, then `result.step`), each as the bench
package's harness sets it up (`harness.Session`: a fresh seeded model, AdamW, the same seeded
batches). Each configuration runs on every workload before the next configuration starts, so
every workload gets its key rows first; eager fp32 runs again on each workload at the end (the
drift over the run).

The budget: before a configuration starts, the seconds left must cover its estimate plus the
eager reruns still owed; otherwise it is skipped and the row says why (the estimate, its basis,
the seconds left). An estimate is eager's whole cost on that workload, plus for a configuration
that compiles the compile cost measured on that workload (the largest set-up and warm-up time
beyond eager's of a configuration that compiled), or `Settings.compile_prior_s` before one was
measured.

Timing: `warmup` steps (the first one timed apart: set-up + first step is what a configuration
costs before it trains, a cold compile included; caches start empty), then `repeats` blocks of
`steps` steps, each block timed with CUDA events (the wall clock on a CPU); ms/step is the
median block, the noise half the range of the blocks. Every configuration starts from torch's
global flags as the run found them (optimize() and pytorch-autotune set TF32 and
cudnn.benchmark process-wide; the row says what a configuration left set).

Results go to OUT/real-size.json and OUT/real-size.md, rewritten after every configuration (a
run killed from outside leaves the rows done and names the configuration it was in). Without
CUDA the sizes are tiny, torch runs one thread (on a CPU shared with other jobs more threads
spin while a sibling is descheduled: steps 30x slower were seen) and every table says it is a
CPU rehearsal, not a GPU figure.

    python -m benchmarks.gpu.real_size --budget 300 [--size auto|real|tiny] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from autoopt.diagnostics.bench import flags, harness, peers
from autoopt.diagnostics.bench.workloads import Workload
from autoopt.runtime.options import Options
from autoopt.runtime.tune import candidate_plans
from benchmarks.gpu import models, tables

SCHEMA = 1
RERUN = "eager (rerun)"
# Most important first (the order the run takes them in), with how each is set up.
CONFIGS = (
    harness.Config("eager", "baseline"),
    harness.Config("autoopt", "autoopt"),
    harness.Config("bf16", "trick", frozenset({"bf16"})),
    harness.Config("compile", "trick", frozenset({"compile"})),
    harness.Config("accelerate-bf16", "peer", package="accelerate"),
    harness.Config("autoopt-tune", "autoopt"),
    harness.Config("pytorch-autotune", "peer", package="pytorch_autotune"),
)
# Configurations that may compile at their first steps (optimize() compiles where it pays).
# What one max-autotune compile of tune=True's is budgeted as, in default-mode compiles.
MAX_AUTOTUNE_COMPILES = 5
COMPILING = {"autoopt", "compile", "autoopt-tune", "pytorch-autotune"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """How many steps each configuration runs and what the budget assumes."""

    size: str
    steps: int  # steps per timed block
    repeats: int  # timed blocks
    warmup: int  # steps before timing, the first timed apart
    compile_prior_s: float  # a compile's cost before one is measured on the workload
    search_s: float  # pytorch-autotune's own search budget


SETTINGS = {
    "real": Settings("real", 5, 5, harness.SETTLE_STEPS, compile_prior_s=60, search_s=90),
    "tiny": Settings("tiny", 2, 3, harness.SETTLE_STEPS, compile_prior_s=20, search_s=15),
}


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds: float
    basis: str
    margin: float = 1.0  # what `seconds` is multiplied by before it must fit (`MARGIN`)


# What the estimate of a configuration that compiles is multiplied by before it must fit in
# the time left: a compile's cost is no bound (the encoder's tune=True, estimated at 65 s,
# started with 69 s left and ran past the quick check's budget, 2026-11-29).
MARGIN = 1.25


class Budget:
    """`seconds` for the whole bench, counted on `clock` from the budget's creation."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.start = clock()

    def used(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def why_not(self, estimate: Estimate, reserve_s: float) -> str | None:
        """Why a configuration of this estimate may not start now (None: it may), its margin
        included."""
        left = self.left()
        needed = estimate.seconds * estimate.margin
        if left > 0 and left - reserve_s >= needed:
            return None
        kept = f", {reserve_s:.0f} s of them kept for the eager reruns" if reserve_s >= 0.5 else ""
        spare = f"; {needed:.0f} s with its margin" if estimate.margin > 1 else ""
        return (
            f"budget: ~{estimate.seconds:.0f} s needed ({estimate.basis}{spare}), "
            f"{max(left, 0):.0f} s of {self.seconds:.0f} s left{kept}"
        )


def cost_s(row: dict[str, Any]) -> float:
    """What a row cost from set-up to its last timed step."""
    return float(row.get("wall_s") or 0.0)


def ready_s(row: dict[str, Any]) -> float:
    """Set-up and warm-up: what a configuration costs before its steady state (a compile may
    come at the first step or, where optimize() measures first, at a later warm-up step)."""
    return sum(float(row.get(k) or 0.0) for k in ("setup_s", "first_step_s", "warmup_s"))


def estimate(
    name: str, done: list[dict[str, Any]], settings: Settings, plans: tuple[int, int] = (1, 1)
) -> Estimate:
    """What configuration `name` will cost on a workload whose rows so far are `done`; `plans`:
    how many plans tune=True measures there, and how many of them compile."""
    eager = next((r for r in done if r["name"] == "eager" and r["status"] == "ok"), None)
    if eager is None:
        return Estimate(0.0, "eager fp32 not measured yet on this workload")
    base = cost_s(eager)
    if name in ("eager", RERUN):
        return Estimate(base, f"eager's {base:.0f} s")
    if name not in COMPILING:
        return Estimate(base, f"as eager, {base:.0f} s")
    compiled = {
        r["name"]: ready_s(r) - ready_s(eager)
        for r in done
        if r["name"] in COMPILING and r["status"] == "ok"
    }
    if compiled:
        worst = max(compiled, key=compiled.__getitem__)
        each, why = max(compiled[worst], 0.0), f"measured: {worst}'s warm-up beyond eager's"
    else:
        each, why = settings.compile_prior_s, "a prior: no compile measured here yet"
    if name == "autoopt-tune":  # each plan measured, the compiled ones and the winner compile
        total, compiled = plans
        seconds = base * (total + 1) + (compiled + 1) * each
        return Estimate(
            seconds,
            f"{total} plans, {compiled} compiled, then the winner: {each:.0f} s a compile ({why})",
            MARGIN,
        )
    if name == "pytorch-autotune":
        seconds = settings.search_s + base + each
        return Estimate(
            seconds, f"its {settings.search_s:.0f} s search + a compile ({why})", MARGIN
        )
    return Estimate(base + each, f"eager + a compile of {each:.0f} s ({why})", MARGIN)


# --- one configuration ------------------------------------------------------------------------


def measure(
    workload: Workload, config: harness.Config, settings: Settings, device: torch.device
) -> dict[str, Any]:
    """Set `config` up on `workload`, warm it up and time it (see the module's docstring).
    Never raises: a configuration that cannot run is a row with its reason."""
    started = time.perf_counter()
    session = harness.Session(workload, config, device)
    session.start(1)  # set-up and the first step (a compiled configuration compiles here)
    row = dict(session.result)
    row["first_step_s"] = row.pop("warmup_s", None)
    if session.step is not None:
        try:
            step, batches = session.step, session.batches
            start = time.perf_counter()
            for _ in range(settings.warmup - 1):
                step(*next(batches))
            _sync(device)
            row["warmup_s"] = round(time.perf_counter() - start, 3)
            blocks, loss = time_blocks(step, batches, settings, device)
            row.update(spread(blocks))
            row["final_loss"] = round(float(loss.detach()), 5)
        except Exception as err:  # a configuration that breaks is a finding, not a crash
            row.update(status="failed", reason=f"{type(err).__name__}: {err}"[:300])
    session.finish()
    row["wall_s"] = round(time.perf_counter() - started, 3)
    return row


def time_blocks(
    step: harness.Step, batches: Iterator[Any], settings: Settings, device: torch.device
) -> tuple[list[float], torch.Tensor]:
    """`repeats` blocks of `steps` steps: each block's ms per step, and the last loss."""
    blocks = []
    loss = torch.zeros(())
    for _ in range(settings.repeats):
        if device.type == "cuda":
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(settings.steps):
                loss = step(*next(batches))
            end.record()
            end.synchronize()
            blocks.append(begin.elapsed_time(end) / settings.steps)
        else:
            start = time.perf_counter()
            for _ in range(settings.steps):
                loss = step(*next(batches))
            blocks.append((time.perf_counter() - start) * 1000 / settings.steps)
    return blocks, loss


def spread(blocks: list[float]) -> dict[str, Any]:
    median = statistics.median(blocks)
    return {
        "ms_median": round(median, 3),
        "noise_pct": round(50 * (max(blocks) - min(blocks)) / median, 1),
        "blocks_ms": [round(b, 3) for b in blocks],
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clean(device: torch.device) -> None:
    """Nothing of the previous configuration stays: compiled code, memory."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- the run ----------------------------------------------------------------------------------


def plan(names: list[str]) -> list[tuple[str, str]]:
    """(configuration, workload) in the order they run: each configuration on every workload,
    most important configuration first, the eager reruns last."""
    order = [(c.name, w) for c in CONFIGS for w in names]
    return order + [(RERUN, w) for w in names]


def run(
    budget_s: float,
    out: Path,
    size: str = "auto",
    names: list[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """The whole bench under `budget_s` seconds; writes OUT/real-size.{json,md} as it goes."""
    device = harness.default_device()
    if size == "auto":
        size = "real" if device.type == "cuda" else "tiny"
    settings = SETTINGS[size]
    every = models.workloads(size)
    names = names or list(every)
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(every)}")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    budget = Budget(budget_s, clock)
    results = header(device, settings, budget_s, names, every)
    described = results["workloads"]
    defaults = flags.read()
    harness.allow_recompiles()
    order = plan(names)
    try:
        for i, (name, workload) in enumerate(order):
            guess, why = decide(
                name, workload, order[i + 1 :], results["rows"], budget, settings, described
            )
            label = f"{workload}: {name}"
            _say(
                f"[{i + 1}/{len(order)}] {label} (~{guess.seconds:.0f} s, {budget.left():.0f} s left)"
            )
            config = CONFIGS[0] if name == RERUN else next(c for c in CONFIGS if c.name == name)
            if why:
                row: dict[str, Any] = {"name": name, "kind": config.kind, "status": "skipped"}
                row["reason"] = why
            else:
                results["running"] = label
                write(results, out)
                if config.search_s is None and name == "pytorch-autotune":
                    config = dataclasses.replace(config, search_s=settings.search_s)
                flags.restore(defaults)
                _clean(device)
                row = {**measure(every[workload], config, settings, device), "name": name}
                if left_set := flags.changed(defaults):
                    row["flags_left"] = left_set
            row.update(workload=workload, estimate_s=round(guess.seconds, 1), basis=guess.basis)
            results["rows"].append(row)
            results["running"] = None
            results["used_s"] = round(budget.used(), 1)
            write(results, out)
    finally:
        flags.restore(defaults)
        torch.set_num_threads(threads)
    results["complete"] = True
    results["load_avg_end"] = _load_avg()
    write(results, out)
    return results


def decide(
    name: str,
    workload: str,
    later: list[tuple[str, str]],
    rows: list[dict[str, Any]],
    budget: Budget,
    settings: Settings,
    workloads: dict[str, dict[str, Any]],
) -> tuple[Estimate, str | None]:
    """The estimate of configuration `name` on `workload`, and why it may not start (None: it
    may): its peer is not installed, or the budget cannot cover it and the eager reruns among
    the `later` runs (a rerun needs only its own estimate). `workloads`: what `header` says of
    each."""

    def done(w: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["workload"] == w]

    info = workloads[workload]
    guess = estimate(name, done(workload), settings, (info["tune_plans"], info["tune_compiled"]))
    config = next((c for c in CONFIGS if c.name == name), CONFIGS[0])
    if config.package and (why := peers.missing(config.package)):
        return guess, why
    reserve = 0.0
    if name != RERUN:
        reserve = sum(estimate(RERUN, done(w), settings).seconds for n, w in later if n == RERUN)
    return guess, budget.why_not(guess, reserve)


def header(
    device: torch.device,
    settings: Settings,
    budget_s: float,
    names: list[str],
    every: dict[str, Workload],
) -> dict[str, Any]:
    from autoopt.runtime.hardware import cpu_model

    cuda = device.type == "cuda"
    described = {}
    for name in names:
        model = every[name].model()
        plans = candidate_plans(model, Options(tune=True))
        described[name] = {
            "description": every[name].description,
            "params": sum(p.numel() for p in model.parameters()),
            "tune_plans": len(plans),
            # a max-autotune compile counted as MAX_AUTOTUNE_COMPILES default ones (a prior:
            # Inductor times its kernel variants; none measured here yet)
            "tune_compiled": sum(
                MAX_AUTOTUNE_COMPILES if p.compile == "max-autotune" else bool(p.compile)
                for p in plans
            ),
        }
    return {
        "schema": SCHEMA,
        "device": torch.cuda.get_device_name(device) if cuda else f"CPU: {cpu_model()}",
        "rehearsal": not cuda,
        "torch": torch.__version__,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "settings": dataclasses.asdict(settings),
        "timer": "CUDA events"
        if cuda
        else f"wall clock, {torch.get_num_threads()} torch thread(s)",
        "budget_s": budget_s,
        "used_s": 0.0,
        "load_avg_start": _load_avg(),
        "peers": peers.describe(["accelerate", "pytorch_autotune"]),
        "workloads": described,
        "rows": [],
        "running": None,
        "complete": False,
    }


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "real-size.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "real-size.md").write_text(tables.markdown(results))


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fresh_caches() -> None:
    """First contact is the honest figure: torch's and autoopt's compile caches start empty
    (unless the caller chose directories)."""
    root = Path(tempfile.mkdtemp(prefix="real-size-caches-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("AUTOOPT_COMPILE_CACHE", str(root / "autoopt"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300, help="seconds for the whole bench")
    parser.add_argument("--size", choices=["auto", *models.SIZES], default="auto")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-results")))
    parser.add_argument("--workload", action="append", help="one of the workloads (repeatable)")
    args = parser.parse_args(argv)
    fresh_caches()
    results = run(args.budget, args.out, args.size, args.workload)
    print(tables.markdown(results), end="")


if __name__ == "__main__":
    main()
