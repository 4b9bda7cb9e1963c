"""The benchmark harness: every configuration of a workload measured the same way, side by side.

A configuration is eager fp32, a hand-applied trick or combination of tricks (bf16 autocast,
channels-last, torch.compile, activation checkpointing), `autoopt.optimize()` with its defaults,
`optimize(tune=True)`, or a peer (Accelerate, Lightning Fabric) set up as its docs say, in its
bf16 and its fp32 configurations. Each one trains a fresh copy of the same seeded model on the
same seeded batches with AdamW: `warmup` steps first (timed apart: that is where compilation
happens; by default `SETTLE_STEPS`, the steps `optimize()`'s on-the-spot optimizer-step timing
takes, so that its blocks time the plan it settled on), then `repeats` blocks of `steps` steps. By default the blocks of all configurations of
a workload run interleaved in one process (see `run_suite`); the step time is the median block.
A block is timed by the wall clock, or with `clock="cpu"` by the process's CPU time: on a CPU
shared with other jobs that figure does not grow with their load, as long as torch runs one
thread (`threads=1`; with more, threads that spin while waiting for a descheduled sibling
count too).

The oracle is the fastest of the hand-applied configurations, i.e. the best plan found by
exhaustive search over the tricks; the best peer the fastest peer configuration. Peak memory is
the CUDA allocator's peak on a GPU; on a CPU it is the growth of the process's resident set
(Linux VmHWM, reset before each configuration) over the set-up and warm-up steps, i.e.
activations, gradients, optimizer state and compiler workspace (approximate when the
configurations share a process: one may reuse memory another freed). `isolate=True` runs each
configuration alone in its own process, for clean memory figures and compiler caches.

`python -m autoopt.diagnostics.bench.harness --one WORKLOAD CONFIG` runs one configuration and prints its JSON;
the isolated suite is built on that.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential
from torch.utils.flop_counter import FlopCounterMode

from autoopt.diagnostics.bench import flags, peers
from autoopt.diagnostics.bench.workloads import WORKLOADS, Workload, checkpoint_segments
from autoopt.runtime.passes import backends
from autoopt.runtime.trials import choices

# Steps until `optimize()` has decided everything it measures on real steps: the optimizer-step
# timing (the first step, then ROUNDS turns of fused, foreach, the default; backends.StepTiming)
# and the layout and amp trials (three configurations at most, a warm-up step each, then at most
# MAX_ROUNDS rounds of two options per choice; trials.choices).
SETTLE_STEPS = 1 + max(backends.ROUNDS * 3, 3 + 2 * 2 * choices.MAX_ROUNDS)

SCHEMA = 1
LR = 1e-3

Step = Callable[[Any, Any], torch.Tensor]

# How a block of steps is timed: "wall" (what a user waits) or "cpu" (this process's user +
# system time, all its threads; steady-state steps start no subprocesses).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Config:
    """One way of training a workload. `tricks` for hand-applied configurations."""

    name: str
    kind: str  # "baseline" | "trick" | "autoopt" | "peer"
    tricks: frozenset[str] = frozenset()
    package: str | None = None  # a peer's package, checked before running
    search_s: float | None = None  # a peer's own search budget (pytorch-autotune's `budget`)


def configs_for(workload: Workload) -> list[Config]:
    """Every configuration that applies to `workload`, eager first."""
    tricks = ["bf16", "compile"] + (["channels_last"] if workload.conv else [])
    out = [Config("eager", "baseline")]
    for r in range(1, len(tricks) + 1):
        for combo in itertools.combinations(tricks, r):
            out.append(Config("+".join(combo), "trick", frozenset(combo)))
    if workload.sequential:
        out.append(Config("checkpoint", "trick", frozenset({"checkpoint"})))
    out += [Config("autoopt", "autoopt"), Config("autoopt-tune", "autoopt")]
    out += [Config(name, "peer", package=package) for name, package in PEERS.items()]
    return out


# Each peer in the configurations its users pick: bf16 mixed precision, and fp32 (what a user
# of a CPU without native bf16 picks, where bf16 is emulated), each Accelerate one with and
# without its dynamo backend. The best peer of a workload is the fastest of all of them.
PEERS = {
    "accelerate-bf16": "accelerate",
    "accelerate-bf16+compile": "accelerate",
    "accelerate-fp32": "accelerate",
    "accelerate-fp32+compile": "accelerate",
    "fabric-bf16": "lightning",
    "fabric-fp32": "lightning",
}


def config_names(workload: Workload) -> list[str]:
    return [c.name for c in configs_for(workload)]


# --- one configuration ------------------------------------------------------------------------


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Session:
    """One configuration of a workload, set up and warmed up, timing blocks of steps on demand:
    the unit both the isolated and the interleaved suite are built from."""

    def __init__(
        self, workload: Workload, config: Config, device: torch.device, clock: str = "wall"
    ) -> None:
        self.workload = workload
        self.config = config
        self.device = device
        self.clock = CLOCKS[clock]
        self.result: dict[str, Any] = {"name": config.name, "kind": config.kind, "status": "ok"}
        self.step: Step | None = None
        self.batches: Iterator[Any] = iter(())
        self.blocks_ms: list[float] = []
        self.loss: torch.Tensor | None = None

    def start(self, warmup: int) -> None:
        """Set the configuration up and run the warm-up steps (where compilation happens). Peak
        memory is taken over these: the steps after them allocate nothing new."""
        config, device = self.config, self.device
        if config.package and (why := peers.missing(config.package)):
            self.result.update(status="skipped", reason=why)
            return
        try:
            torch.manual_seed(0)
            model = self.workload.model()
            loader = self.workload.loader()
            optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
            _reset_peak(device)
            start = time.perf_counter()
            loader, step, notes = _prepare(config, self.workload, model, loader, optimizer, device)
            self.result["setup_s"] = round(time.perf_counter() - start, 3)
            self.result.update(notes)
            self.batches = _endless(loader)
            base = _memory_now(device)
            _reset_peak(device)
            start = time.perf_counter()
            for _ in range(warmup):
                self.loss = step(*next(self.batches))
            _sync(device)
            self.result["warmup_s"] = round(time.perf_counter() - start, 3)
            self.result["peak_mem_mb"] = round(max(0.0, _memory_peak(device) - base) / 2**20, 1)
            self.step = step
        except Exception as err:  # a configuration that breaks is a finding, not a crash
            self._fail(err)

    def block(self, steps: int) -> None:
        """Time `steps` steps; their mean is one sample of the configuration's step time."""
        if self.step is None:
            return
        try:
            start = self.clock()
            for _ in range(steps):
                self.loss = self.step(*next(self.batches))
            _sync(self.device)
            self.blocks_ms.append((self.clock() - start) * 1000 / steps)
        except Exception as err:
            self._fail(err)

    def finish(self) -> dict[str, Any]:
        """The result row (medians over the blocks); frees the model and its batches."""
        if self.step is not None and self.blocks_ms:
            median = statistics.median(self.blocks_ms)
            self.result.update(
                ms_median=round(median, 3),
                ms_min=round(min(self.blocks_ms), 3),
                ms_max=round(max(self.blocks_ms), 3),
                spread_pct=round(100 * (max(self.blocks_ms) - min(self.blocks_ms)) / median, 1),
                repeats_ms=[round(ms, 3) for ms in self.blocks_ms],
            )
            if self.loss is not None:
                self.result["final_loss"] = round(float(self.loss.detach()), 5)
        self.step, self.batches, self.loss = None, iter(()), None
        return self.result

    def _fail(self, err: Exception) -> None:
        self.result = {
            **self.result,
            "status": "failed",
            "reason": f"{type(err).__name__}: {err}"[:300],
        }
        self.step = None


def run_config(
    workload: Workload,
    config: Config,
    *,
    steps: int,
    repeats: int,
    warmup: int,
    device: torch.device | None = None,
    clock: str = "wall",
) -> dict[str, Any]:
    """Train `workload` the way `config` says and measure it, alone. Never raises: a
    configuration that cannot run comes back with status "skipped" or "failed" and the reason."""
    session = Session(workload, config, device or default_device(), clock)
    session.start(warmup)
    for _ in range(repeats):
        session.block(steps)
    return session.finish()


def _prepare(
    config: Config,
    workload: Workload,
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
) -> tuple[Any, Step, dict[str, Any]]:
    """Set `config` up; returns the loader to iterate, the step function and notes."""
    loss_fn = workload.loss
    if config.kind in ("baseline", "trick"):
        return loader, _trick_step(model, optimizer, loss_fn, config.tricks, device), {}
    if config.name == "autoopt":
        import autoopt

        model, loader, optimizer = autoopt.optimize(model, loader, optimizer, verbose=False)
        return loader, _plain_step(model, optimizer, loss_fn), _autoopt_notes(model)
    if config.name == "autoopt-tune":
        return _tuned(model, loader, optimizer, loss_fn)
    if config.name.startswith("accelerate"):
        model.to(device)
        precision = "bf16" if "bf16" in config.name else "no"
        loader, step = peers.accelerate(
            model, optimizer, loader, loss_fn, precision, compile="compile" in config.name
        )
        return loader, step, {}
    if config.name == "pytorch-autotune":
        return peers.pytorch_autotune(model, loader, loss_fn, device, LR, config.search_s or 60)
    if config.name.startswith("fabric"):
        precision = "bf16-mixed" if "bf16" in config.name else "32-true"
        loader, step = peers.fabric(model, optimizer, loader, loss_fn, precision)
        return loader, step, {}
    raise ValueError(f"unknown configuration {config.name!r}")


def _tuned(
    model: nn.Module, loader: Any, optimizer: torch.optim.Optimizer, loss_fn: Any
) -> tuple[Any, Step, dict[str, Any]]:
    """`optimize(tune=True)` with an empty decision cache, so the tuning itself is measured."""
    import autoopt
    from autoopt.runtime import optimize as optimize_module
    from autoopt.runtime import tune
    from autoopt.runtime.options import Options

    with tempfile.TemporaryDirectory() as cache, _env(tune.CACHE_ENV, cache):
        if "choose" in optimize_module.optimize.__code__.co_names:
            model, loader, optimizer = autoopt.optimize(
                model, loader, optimizer, tune=True, verbose=False
            )
            return loader, _plain_step(model, optimizer, loss_fn), _autoopt_notes(model)
        # optimize() does not call tune yet: do what it will do, with the same function.
        decision = tune.choose(model, loader, optimizer, Options(tune=True, verbose=False))
        chosen = {k: getattr(decision.options, k) for k in tune.SEARCHED}
        model, loader, optimizer = autoopt.optimize(
            model, loader, optimizer, **chosen, verbose=False
        )
        notes = {**_autoopt_notes(model), "tune": decision.result.detail}
        notes["note"] = "tune.choose() called by the harness: optimize() does not call it yet"
        return loader, _plain_step(model, optimizer, loss_fn), notes


def _autoopt_notes(model: nn.Module) -> dict[str, Any]:
    import autoopt

    report = autoopt.report(model)
    notes: dict[str, Any] = {"applied": report.applied()}
    if "tune" in report:
        notes["tune"] = report["tune"].detail
    return notes


def _trick_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    tricks: frozenset[str],
    device: torch.device,
) -> Step:
    """The step a user writes by hand for these tricks (autocast around forward and loss)."""
    model.to(device)
    channels_last = "channels_last" in tricks
    if channels_last:
        model.to(memory_format=torch.channels_last)
    forward: Callable[[Any], Any] = model
    if "checkpoint" in tricks:
        segments = checkpoint_segments(model)  # type: ignore[arg-type]

        def forward(x: Any) -> Any:
            return checkpoint_sequential(model, segments, x, use_reentrant=False)

    if "compile" in tricks:
        forward = torch.compile(forward)
    dtype = torch.bfloat16 if "bf16" in tricks else None

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        optimizer.zero_grad()
        amp = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
        with amp:
            loss = loss_fn(forward(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _plain_step(
    model: nn.Module, optimizer: Any, loss_fn: Callable[[Any, Any], torch.Tensor]
) -> Step:
    """The user's unchanged loop body (autoopt's loader already put the batch on the device)."""

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step


def _endless(loader: Any) -> Iterator[Any]:
    """Epoch after epoch over the loader, as a training loop does."""
    while True:
        yield from loader


# --- memory, FLOPs, peak ----------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # "5" resets the resident-set high-water mark (Linux)
        Path("/proc/self/clear_refs").write_text("5")


def _proc_status(field: str) -> float:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return 0.0
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    return float(match.group(1)) * 1024 if match else 0.0


def _memory_now(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    return _proc_status("VmRSS")


def _memory_peak(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return _proc_status("VmHWM")


def count_flops(workload: Workload, device: torch.device | None = None) -> int:
    """FLOPs of one fp32 training step (forward + backward) on one batch, by FlopCounterMode."""
    device = device or default_device()
    model = workload.model().to(device)
    x, y = (t.to(device) for t in workload.example_batch())
    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss(model(x), y).backward()
    return int(counter.get_total_flops())


def measure_peak(
    device: torch.device | None = None, n: int = 1024, clock: str = "wall"
) -> dict[str, float]:
    """The machine's measured matmul throughput in GFLOP/s, per dtype, and the best of them:
    the denominator of model FLOP utilisation (MFU), timed by the clock the steps are."""
    device = device or default_device()
    now = CLOCKS[clock]
    peaks: dict[str, float] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        best = float("inf")
        for _ in range(5):
            _sync(device)
            start = now()
            a @ b
            _sync(device)
            best = min(best, now() - start)
        peaks[name] = round(2 * n**3 / best / 1e9, 1)
    peaks["best"] = max(peaks.values())
    return peaks


# --- the suite --------------------------------------------------------------------------------


Progress = Callable[[str, int, int], None]  # (what runs now, events done, events in all)


def run_suite(
    workloads: list[str] | None = None,
    *,
    configs: list[str] | None = None,
    steps: int = 10,
    repeats: int = 3,
    warmup: int = SETTLE_STEPS,
    isolate: bool = False,
    clock: str = "wall",
    threads: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run every configuration of every workload named (all by default) and summarise.

    By default the configurations of a workload run interleaved in this process: each is set
    up and warmed up, then the timed blocks go round-robin (block 1 of every configuration,
    then block 2, ...), so load from other processes that comes and goes slows every
    configuration alike; medians over the blocks. Configurations whose models would not fit
    in memory together run in consecutive groups. `isolate=True` runs each configuration alone
    in its own process instead (clean memory figures and compiler caches, but a burst of load
    lands on whichever configuration runs then). `clock`: see the module's docstring; `threads`:
    torch's intra-op threads (default: torch's own choice)."""
    names = workloads or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; choose from {list(CLOCKS)}")
    device = default_device()
    if clock == "cpu" and device.type == "cuda":
        raise ValueError("clock='cpu' does not see the GPU's work: use the wall clock on CUDA")
    if threads is not None:
        torch.set_num_threads(threads)
    results: dict[str, Any] = {
        "schema": SCHEMA,
        "created": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(device, clock),
        "settings": {
            "steps": steps,
            "repeats": repeats,
            "warmup": warmup,
            "isolate": isolate,
            "clock": clock,
        },
        "workloads": [],
    }
    peak = results["machine"]["peak_gflops"]["best"]
    plan = {name: selected_configs(WORKLOADS[name], configs) for name in names}
    per_config = 1 if isolate else 1 + repeats  # progress events: set-up, then each block
    ticker = _Ticker(progress, sum(len(c) for c in plan.values()) * per_config)
    if not isolate:
        allow_recompiles()
    for name, wanted in plan.items():
        workload = WORKLOADS[name]
        kwargs: dict[str, Any] = {"steps": steps, "repeats": repeats, "warmup": warmup}
        if isolate:
            rows = []
            for config in wanted:
                ticker(f"{name}: {config.name}")
                threads_now = torch.get_num_threads()
                rows.append(
                    _run_isolated(name, config.name, clock=clock, threads=threads_now, **kwargs)
                )
        else:
            rows = run_interleaved(
                workload, wanted, device=device, ticker=ticker, clock=clock, **kwargs
            )
        flops = count_flops(workload, device)
        results["workloads"].append(summarise(workload, rows, flops, peak))
    ticker.done()
    results["machine"]["load_avg_end"] = _load_avg()
    return results


def selected_configs(workload: Workload, names: list[str] | None) -> list[Config]:
    """The configurations of `workload` named (all when None), eager always among them."""
    every = configs_for(workload)
    if not names:
        return every
    return [c for c in every if c.name in names or c.name == "eager"]


def run_interleaved(
    workload: Workload,
    configs: list[Config],
    *,
    steps: int,
    repeats: int,
    warmup: int,
    device: torch.device,
    ticker: Callable[[str], None],
    clock: str = "wall",
) -> list[dict[str, Any]]:
    """The configurations in this process, timed blocks round-robin (see `run_suite`). Each
    is set up from the process-wide backend flags as they were found (`flags`), and each of its
    blocks runs with the flags it set up: optimize() turns TF32 on for the whole process on
    CUDA, which would otherwise time eager fp32's blocks in TF32 too."""
    rows: dict[str, dict[str, Any]] = {}
    found = flags.read()
    try:
        for group in _groups_that_fit(workload, configs, device):
            sessions = []
            for config in group:
                ticker(f"{workload.name}: {config.name} (set-up + {warmup} warm-up steps)")
                flags.restore(found)
                session = Session(workload, config, device, clock)
                session.start(warmup)
                sessions.append((session, flags.read()))
            for r in range(repeats):
                for session, own in sessions:
                    ticker(f"{workload.name}: {session.config.name} (block {r + 1}/{repeats})")
                    flags.restore(own)
                    session.block(steps)
            for session, _ in sessions:
                rows[session.config.name] = session.finish()
    finally:
        flags.restore(found)
    return [rows[c.name] for c in configs]


def _groups_that_fit(
    workload: Workload, configs: list[Config], device: torch.device
) -> list[list[Config]]:
    """Consecutive groups of configurations whose models, gradients and AdamW state (4x the
    parameters, twice for activations and compiler workspace) fit in a third of the memory."""
    from autoopt.runtime.hardware import available_host_memory

    size = sum(p.numel() * p.element_size() for p in workload.model().parameters())
    if device.type == "cuda":
        available = torch.cuda.mem_get_info(device)[0]
    else:
        available = available_host_memory() or 2**30
    per_group = max(1, int(available / 3 // (8 * size or 1)))
    return [configs[i : i + per_group] for i in range(0, len(configs), per_group)]


def allow_recompiles() -> None:
    """Configurations that compile share this process and the model class's forward code:
    dynamo's per-code recompile limit (8) would otherwise leave later ones silently eager."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)


class _Ticker:
    """Counts progress events and reports each with its number: '(3/40) cnn: bf16'."""

    def __init__(self, progress: Progress | None, total: int) -> None:
        self.progress = progress
        self.total = total
        self.count = 0

    def __call__(self, label: str) -> None:
        if self.progress is not None:
            self.progress(label, self.count, self.total)
        self.count += 1

    def done(self) -> None:
        if self.progress is not None:
            self.progress("done", self.count, self.total)


def _run_isolated(workload: str, config: str, **kwargs: Any) -> dict[str, Any]:
    """One configuration in a fresh Python process: clean memory peak, caches and globals."""
    cmd = [sys.executable, "-m", "autoopt.diagnostics.bench.harness", "--one", workload, config]
    for key, value in kwargs.items():
        cmd += [f"--{key}", str(value)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except subprocess.TimeoutExpired:
        return {"name": config, "kind": "?", "status": "failed", "reason": "timed out (30 min)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"name": config, "kind": "?", "status": "failed", "reason": tail[0][:300]}


def summarise(
    workload: Workload, rows: list[dict[str, Any]], flops: int, peak_gflops: float
) -> dict[str, Any]:
    """Add speed-up vs eager, ratio to the oracle and to the best peer, and MFU to each row."""
    ok = [r for r in rows if r["status"] == "ok"]
    eager = next((r for r in ok if r["name"] == "eager"), None)
    tricks = [r for r in ok if r["kind"] in ("baseline", "trick")]
    oracle = min(tricks, key=lambda r: r["ms_median"], default=None)
    peer_rows = [r for r in ok if r["kind"] == "peer"]
    best_peer = min(peer_rows, key=lambda r: r["ms_median"], default=None)
    for r in ok:
        ms = r["ms_median"]
        r["speedup"] = round(eager["ms_median"] / ms, 3) if eager else None
        r["vs_oracle"] = round(ms / oracle["ms_median"], 3) if oracle else None
        r["vs_best_peer"] = round(ms / best_peer["ms_median"], 3) if best_peer else None
        r["mfu_pct"] = round(100 * flops / (ms / 1000) / (peak_gflops * 1e9), 2) if flops else None
    model = workload.model()
    return {
        "name": workload.name,
        "description": workload.description,
        "params": sum(p.numel() for p in model.parameters()),
        "flops_per_step": flops,
        "eager_ms": eager["ms_median"] if eager else None,
        "oracle": oracle["name"] if oracle else None,
        "oracle_ms": oracle["ms_median"] if oracle else None,
        "best_peer": best_peer["name"] if best_peer else None,
        "best_peer_ms": best_peer["ms_median"] if best_peer else None,
        "configs": rows,
    }


def machine_info(device: torch.device, clock: str = "wall") -> dict[str, Any]:
    from autoopt.runtime.hardware import cpu_model

    info: dict[str, Any] = {
        "device": str(device),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_avg_start": _load_avg(),
        "peak_gflops": measure_peak(device, clock=clock),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    for package in ("accelerate", "lightning"):
        with contextlib.suppress(Exception):
            info[package] = __import__(package).__version__
    return info


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one benchmark configuration (JSON out).")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "CONFIG"), required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=SETTLE_STEPS)
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    workload = WORKLOADS[args.one[0]]
    config = next(c for c in configs_for(workload) if c.name == args.one[1])
    row = run_config(
        workload,
        config,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        clock=args.clock,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
