"""`autoopt selftest`: every pass that applies on this machine, proved against the same loop
written with torch's own tools, and timed beside it.

Each check trains a small representative model (a CNN with BatchNorm, a stack of transformer
blocks, an LSTM) for a few steps twice from the same weights and batches: once through
`optimize()` with only the pass under test enabled, once by hand (`torch.autocast` +
`torch.amp.GradScaler`, `model.to(memory_format=torch.channels_last)`, `torch.compile`,
`torch.utils.checkpoint`, accumulation by hand). It compares the losses and the trained
parameters with a tolerance for the dtype, checks the pass's invariants (fp16: a step with an
injected inf is skipped and the scale halves, as GradScaler's; the loader's batches are the
user's, pinned on CUDA; the memory plan's peak against `torch.cuda.max_memory_allocated`), and
times both in interleaved blocks (CUDA events on a GPU). Exit 1 on any mismatch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

# Relative tolerances on the losses and on the trained parameters, by the dtype the pass computes
# in. fp32 passes reorder no arithmetic beyond the optimizer's fused kernels (~1e-7 per step).
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 1e-2}


@dataclass
class Row:
    """One line of the selftest table."""

    check: str
    status: str  # "ok" | "mismatch" | "skipped" | "error"
    applied: str  # what optimize() reported, or why the check does not apply here
    max_diff: float | None = None
    tolerance: float | None = None
    speedup: float | None = None  # by-hand time / optimize() time, same steps
    note: str = ""
    # The slowest and fastest block's ratio (the run's noise), and one step of the loop by hand.
    speedup_range: tuple[float, float] | None = None
    step_ms: float | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "error")

    def slow_reason(self) -> str:
        """How an "ok" slower than torch by hand was slower, in this run's figures ("" if it
        was not): within the run's noise (a block had optimize() ahead), or in every block.
        What that means is said once, under the report (`SLOW_OK`)."""
        if self.status != "ok" or self.speedup is None or self.speedup >= 1:
            return ""
        low, high = self.speedup_range or (self.speedup, self.speedup)
        if high >= 1:
            return f"slower in the median, within this run's noise (blocks {low:.2f}x-{high:.2f}x)"
        step = f", by hand {self.step_ms:.1f} ms/step" if self.step_ms is not None else ""
        return f"slower than by hand in every block of this run ({low:.2f}x-{high:.2f}x{step})"


# Said under the report when a check was ok but slower than by hand.
SLOW_OK = (
    "ok with a speed under 1: the results match, and optimize() was slower than torch by hand "
    "on these few steps of a small model; autoopt bench measures speed on full-size workloads."
)


# --- models and data ---------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, 4, batch_first=True)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class TinyLM(nn.Module):
    """A transformer block stack in an nn.ModuleList: what the checkpoint planner looks for."""

    def __init__(self, vocab: int = 64, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x).flatten(0, 1)


class TinyLSTM(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0]).flatten(0, 1)


def tiny_cnn(classes: int = 10) -> nn.Module:
    def stage(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *stage(3, 16), *stage(16, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes)
    )


@dataclass
class Workload:
    name: str
    build: Callable[[], nn.Module]
    batches: list[tuple[torch.Tensor, torch.Tensor]]


def workloads(quick: bool, seed: int = 0) -> dict[str, Workload]:
    """The three models with their batches (CPU tensors; the loops move them)."""
    g = torch.Generator().manual_seed(seed)
    n, side, seq = (4, 16, 16) if quick else (8, 32, 64)
    steps = 4 if quick else 8

    def images() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (torch.randn(n, 3, side, side, generator=g), torch.randint(0, 10, (n,), generator=g))
            for _ in range(steps)
        ]

    def tokens() -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for _ in range(steps):
            t = torch.randint(0, 64, (n, seq + 1), generator=g)
            out.append((t[:, :-1], t[:, 1:].flatten()))
        return out

    return {
        "cnn": Workload("cnn", tiny_cnn, images()),
        "transformer": Workload("transformer", TinyLM, tokens()),
        "lstm": Workload("lstm", TinyLSTM, tokens()),
    }


# --- the loops -----------------------------------------------------------------------------------


@dataclass
class ByHand:
    """How the reference loop differs from plain torch: each field is torch's own tool."""

    autocast: torch.dtype | None = None
    scaler: bool = False
    channels_last: bool = False
    compile: bool = False
    checkpoint: bool = False
    accumulate: int = 1
    ddp: bool = False  # DistributedDataParallel over the process group optimize() set up


def _seeded(build: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return build().to(device)


def _checkpointed(model: nn.Module) -> None:
    """Each block of `model.blocks` through torch.utils.checkpoint (non-reentrant)."""
    from torch.utils.checkpoint import checkpoint

    for block in model.blocks:
        forward = block.forward
        block.forward = lambda x, f=forward: checkpoint(f, x, use_reentrant=False)


Step = Callable[[torch.Tensor, torch.Tensor], float]


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    # SGD with momentum: linear in the gradients, so a rounding difference stays a rounding
    # difference (Adam's first steps turn a 1e-9 gradient into a full lr-sized update).
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def by_hand(
    build: Callable[[], nn.Module], device: torch.device, how: ByHand
) -> tuple[nn.Module, Step]:
    """The loop a user writes with torch's tools: the model and one training step."""
    model = _seeded(build, device)
    if how.channels_last:
        model = model.to(memory_format=torch.channels_last)
    if how.checkpoint:
        _checkpointed(model)
    optimizer = _optimizer(model)
    if how.ddp:
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    forward = torch.compile(model) if how.compile else model
    scaler = torch.amp.GradScaler(device.type) if how.scaler else None
    calls = 0

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        nonlocal calls
        x, y = x.to(device), y.to(device)
        if how.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        autocast: AbstractContextManager[Any] = (
            torch.autocast(device.type, dtype=how.autocast) if how.autocast else nullcontext()
        )
        with autocast:
            loss = F.cross_entropy(forward(x), y)
        scaled = loss / how.accumulate
        (scaler.scale(scaled) if scaler else scaled).backward()
        calls += 1
        if calls % how.accumulate == 0:
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad()
        return loss.detach().item()

    return model, step


def optimized(
    build: Callable[[], nn.Module],
    device: torch.device,
    options: dict[str, Any],
    *,
    accumulate: int = 1,
) -> tuple[nn.Module, Step]:
    """The plain loop, unchanged, after `optimize()`: the model and one training step."""
    import autoopt

    model = _seeded(build, device)
    optimizer = _optimizer(model)
    model, optimizer = autoopt.optimize(
        model, None, optimizer, device=device, verbose=False, **_isolated(options, accumulate)
    )

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(device), y.to(device)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach().item()

    return model, step


def train(step: Step, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    return [step(x, y) for x, y in batches]


def _isolated(options: dict[str, Any], accumulate: int) -> dict[str, Any]:
    """Only the pass under test: every other "auto" choice is turned off."""
    off = {
        "amp": False,
        "compile": False,
        "channels_last": False,
        "checkpoint": False,
        "distributed": False,  # under torchrun only the distributed check distributes
    }
    return {**off, "memory_budget": None, "accumulate": accumulate, **options}


def max_relative_diff(
    a: nn.Module, b: nn.Module, losses_a: list[float], losses_b: list[float]
) -> float:
    """The largest difference between two runs: per loss, and per parameter tensor (by norm)."""
    import autoopt

    worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(losses_a, losses_b, strict=True))
    params_b = dict(autoopt.unwrap(b).named_parameters())
    for name, p in autoopt.unwrap(a).named_parameters():
        q = params_b[name].detach().float()
        diff = (p.detach().float() - q).norm() / q.norm().clamp_min(1e-12)
        worst = max(worst, float(diff))
    return worst


# --- timing --------------------------------------------------------------------------------------


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Speed:
    """By-hand time over optimize() time: the median, the range over the blocks, and the
    median time of one step of the loop by hand."""

    ratio: float
    low: float
    high: float
    step_ms: float


def interleaved_speedup(
    reference: Callable[[], Any],
    candidate: Callable[[], Any],
    device: torch.device,
    blocks: int,
    steps: int = 1,
    warm: bool = False,
) -> Speed:
    """`reference` against `candidate` (each a run of `steps` steps), timed in alternating
    blocks (so load on the machine falls on both alike), after one warm-up call each unless
    both have run already (`warm`)."""
    times: dict[str, list[float]] = {"ref": [], "cand": []}
    if not warm:
        reference()
        candidate()
    for _ in range(blocks):
        for key, fn in (("ref", reference), ("cand", candidate)):
            _synchronize(device)
            if device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times[key].append(start.elapsed_time(end) / 1000)
            else:
                began = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - began)
    ratios = [r / c for r, c in zip(times["ref"], times["cand"], strict=True)]
    ref = statistics.median(times["ref"])
    return Speed(
        ref / statistics.median(times["cand"]), min(ratios), max(ratios), ref * 1000 / steps
    )


# --- the checks ----------------------------------------------------------------------------------


@dataclass
class Setting:
    """Where the selftest runs: device, what it supports, how thorough."""

    device: torch.device
    quick: bool
    bf16: bool
    distributed: bool

    @property
    def blocks(self) -> int:
        return 2 if self.quick else 5


def _pass_status(model: nn.Module, name: str) -> tuple[bool, str]:
    import autoopt

    result = autoopt.report(model)[name]
    return result.status.value == "applied", f"{result.status.value}: {result.detail}"


def compare(
    setting: Setting,
    check: str,
    work: Workload,
    pass_name: str,
    options: dict[str, Any],
    how: ByHand,
    dtype: str,
    *,
    accumulate: int = 1,
    timed: bool = True,
) -> Row:
    """Train `work` through optimize(options) and by hand, compare, time (unless `timed` is
    False: a check about memory, not speed); one table row."""
    device = setting.device
    model, step = optimized(work.build, device, options, accumulate=accumulate)
    losses = train(step, work.batches)
    applied, detail = _pass_status(model, pass_name)
    if not applied:
        return Row(check, "mismatch", detail, note="optimize() did not apply the pass asked for")
    reference, ref_step = by_hand(work.build, device, how)
    ref_losses = train(ref_step, work.batches)
    diff = max_relative_diff(model, reference, losses, ref_losses)
    tolerance = TOLERANCE[dtype]
    status = "ok" if diff <= tolerance else "mismatch"
    note = f"{work.name}, {len(work.batches)} steps"
    if not timed:
        return Row(check, status, detail, diff, tolerance, None, note)
    speed = interleaved_speedup(
        lambda: train(ref_step, work.batches),
        lambda: train(step, work.batches),
        device,
        setting.blocks,
        steps=len(work.batches),
        warm=True,  # both trained on these batches above: their first steps are behind them
    )
    return Row(
        check,
        status,
        detail,
        diff,
        tolerance,
        speed.ratio,
        note,
        (speed.low, speed.high),
        speed.step_ms,
    )


def check_fp16_scaling(setting: Setting, work: Workload) -> Row:
    """fp16 loss scaling against GradScaler, then an injected inf: the step is skipped (parameters
    untouched) and the scale halves, exactly as GradScaler does."""
    from autoopt.runtime.scaling.loss_scaling import scaler_of

    row = compare(
        setting,
        "amp fp16 + loss scaling",
        work,
        "amp",
        {"amp": "fp16"},
        ByHand(torch.float16, scaler=True),
        "fp16",
    )
    if row.failed:
        return row
    import autoopt

    device = setting.device
    model = _seeded(work.build, device)
    optimizer = _optimizer(model)
    model, optimizer = autoopt.optimize(
        model, None, optimizer, device=device, verbose=False, **_isolated({"amp": "fp16"}, 1)
    )
    x, y = (t.to(device) for t in work.batches[0])
    scaler = scaler_of(autoopt.unwrap(model))
    before_scale = scaler.scale
    F.cross_entropy(model(x), y).backward()
    next(iter(autoopt.unwrap(model).parameters())).grad.fill_(float("inf"))
    params = [p.detach().clone() for p in autoopt.unwrap(model).parameters()]
    optimizer.step()
    untouched = all(
        torch.equal(a, p) for a, p in zip(params, autoopt.unwrap(model).parameters(), strict=True)
    )
    halved = scaler.scale == before_scale * 0.5
    if not (untouched and halved):
        row.status = "mismatch"
        row.note = f"injected inf: step skipped={untouched}, scale {before_scale} -> {scaler.scale}"
    else:
        row.note += "; injected inf: step skipped, scale halved"
    return row


def check_loader(setting: Setting, work: Workload) -> Row:
    """The loader optimize() returns yields the user's batches, in order, on the device; on CUDA
    from pinned memory."""
    import autoopt

    device = setting.device
    data = torch.utils.data.TensorDataset(
        torch.cat([x for x, _ in work.batches]),
        torch.cat([y.view(len(x), -1)[:, 0] for x, y in work.batches]),
    )
    loader = torch.utils.data.DataLoader(data, batch_size=len(work.batches[0][0]), shuffle=False)
    model = _seeded(work.build, device)
    model, new_loader = autoopt.optimize(
        model, loader, device=device, verbose=False, **_isolated({}, 1)
    )
    applied, detail = _pass_status(model, "loader")
    ours = list(new_loader)
    same = len(ours) == len(loader) and all(
        a.device.type == device.type and torch.equal(a.cpu(), b)
        for got, want in zip(ours, loader, strict=False)
        for a, b in zip(got, want, strict=True)
    )
    note = f"{len(ours)} batches, same order and values, on {device.type}"
    if device.type == "cuda":
        # The host batches the device loader copies from (its wrapped, rebuilt DataLoader):
        # page-locked, so the copy can overlap the compute.
        host = next(iter(new_loader.loader))
        pinned = all(t.is_pinned() for t in host)
        note += f"; host batches pinned: {pinned}"
        same = same and pinned
    return Row("loader", "ok" if same and applied else "mismatch", detail, note=note)


def check_memory_plan(setting: Setting, work: Workload) -> Row:
    """checkpoint under a budget no plan meets (every block checkpointed) against
    torch.utils.checkpoint by hand: exact gradients. The planned peak is `check_memory_fit`'s."""
    return compare(
        setting,
        "checkpoint (memory budget)",
        work,
        "checkpoint",
        {"checkpoint": "auto", "memory_budget": 1},
        ByHand(checkpoint=True),
        "fp32",
    )


# How far the planned peak of a step may be from the measured one.
def check_compile(setting: Setting, work: Workload) -> Row:
    """optimize(compile=True) against torch.compile by hand. A compiled fp32 step rounds
    differently from an eager one (inductor fuses and reorders), and a few training steps can
    grow that past the fp32 tolerance: torch's own compile, against the same loop eager, sets
    the floor. optimize()'s compile passes when it is no further from torch's compile than
    torch's compile is from eager (or within the fp32 tolerance)."""
    row = compare(
        setting, "compile", work, "compile", {"compile": True}, ByHand(compile=True), "fp32"
    )
    if row.status != "mismatch" or row.max_diff is None or row.tolerance is None:
        return row
    compiled, compiled_step = by_hand(work.build, setting.device, ByHand(compile=True))
    compiled_losses = train(compiled_step, work.batches)
    eager, eager_step = by_hand(work.build, setting.device, ByHand())
    floor = max_relative_diff(compiled, eager, compiled_losses, train(eager_step, work.batches))
    if row.max_diff <= floor:
        row.status = "ok"
        row.tolerance = floor
        row.note += f"; tolerance: torch.compile by hand vs eager differ by {floor:.1e} here"
    return row


PEAK_TOLERANCE = 0.10


def check_memory_fit(setting: Setting, work: Workload) -> Row:
    """A step that does not fit the memory budget at the requested batch (the budget is the
    state plus a third of eager's activations) trains under optimize(checkpoint="auto") equal
    to the plain loop, and the plan's peak is within 10% of a measured one: the CUDA
    allocator's (`torch.cuda.max_memory_allocated`) on a GPU; on the CPU torch's profiler's
    allocation events plus the resident storages, a measure that shares no code with the
    planner (`autoopt.diagnostics.measured_memory`). On CUDA `memory_budget="auto"` is checked
    to be the free CUDA memory (`torch.cuda.mem_get_info`) plus what the model holds."""
    import autoopt
    from autoopt.diagnostics.measured_memory import resident, step_peak
    from autoopt.runtime.checkpointing.checkpoint_plan import memory_plan
    from autoopt.runtime.memory import (
        format_bytes,
        resolve_budget,
        saved_tensor_bytes,
        state_memory,
    )

    device = setting.device
    if setting.quick:  # two steps show the equality; the peak is one step's either way
        work = Workload(work.name, work.build, work.batches[:2])
    probe = _seeded(work.build, device)
    x, y = (t.to(device) for t in work.batches[0])
    state = state_memory(probe, _optimizer(probe)).state
    budget = state + saved_tensor_bytes(functools.partial(probe, x)) // 3
    options = {"checkpoint": "auto", "memory_budget": budget}
    row = compare(
        setting,
        "memory budget (does not fit)",
        work,
        "checkpoint",
        options,
        ByHand(),
        "fp32",
        timed=False,
    )
    if row.failed:
        return row
    model = _seeded(work.build, device)
    optimizer = _optimizer(model)
    model, optimizer = autoopt.optimize(
        model, None, optimizer, device=device, verbose=False, **_isolated(options, 1)
    )

    def step() -> None:
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        # Gradients kept between steps: resident through the forward, as the plan counts them.
        optimizer.zero_grad(set_to_none=False)

    step()  # plans on the first batch and allocates the optimizer's state
    plan = memory_plan(model)
    if plan is None:
        return dataclasses.replace(row, status="mismatch", note="no memory plan was made")
    measured = step_peak(autoopt.unwrap(model), optimizer, step)
    off = plan.peak / measured - 1
    how = (
        "torch.cuda.max_memory_allocated above the start + resident storages"
        if device.type == "cuda"
        else "torch's profiler (CPU allocations) + resident storages"
    )
    row.note += (
        f"; eager step {format_bytes(plan.before.total)} > budget {format_bytes(budget)}; "
        f"{plan.blocks()}; planned peak {format_bytes(plan.peak)}, measured "
        f"{format_bytes(measured)} by {how} ({off:+.0%})"
    )
    fits = plan.before.total > budget >= plan.after.total
    if not fits or abs(off) > PEAK_TOLERANCE:
        row.status = "mismatch"
    if device.type == "cuda":
        held = resident(autoopt.unwrap(model), optimizer)
        free, _total = torch.cuda.mem_get_info(device)
        auto = resolve_budget("auto", device, held=held)
        row.note += (
            f"; memory_budget='auto' = {format_bytes(auto or 0)} (free {format_bytes(free)} + held)"
        )
        if auto is None or abs(auto - (free + held)) > PEAK_TOLERANCE * (free + held):
            row.status = "mismatch"
    return row


def check_distributed(setting: Setting, work: Workload) -> Row:
    """Under torchrun: optimize(distributed="ddp") against DistributedDataParallel by hand,
    each rank on its own share of the batches; every rank checks, rank 0 reports."""
    import torch.distributed as dist

    if not setting.distributed:
        return Row(
            "distributed", "skipped", "single process: run under torchrun --nproc_per_node=N"
        )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shard = Workload(work.name, work.build, work.batches[rank::world] or work.batches[:1])
    row = compare(
        setting,
        "distributed (DDP)",
        shard,
        "distributed",
        {"distributed": "ddp"},
        ByHand(ddp=True),
        "fp32",
    )
    worst = torch.tensor([row.max_diff or 0.0, float(row.failed)])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # a mismatch on any rank fails every rank
    row.max_diff = float(worst[0])
    if worst[1] and not row.failed:
        row.status, row.note = "mismatch", row.note + "; another rank differed"
    row.note += f"; {world} ranks"
    return row


Check = tuple[str, Callable[[], Row]]


def planned_checks(quick: bool = False, device: str | None = None) -> list[Check]:
    """Every check, in order, as (name, run it): the command says each one as it runs."""
    from autoopt.runtime import hardware

    dev = resolve_device(device)
    bf16 = hardware.cuda_supports_bf16(dev) if dev.type == "cuda" else hardware.cpu_supports_bf16()
    setting = Setting(dev, quick, bf16, int(os.environ.get("WORLD_SIZE", "1")) > 1)
    work = workloads(quick)
    checks: list[tuple[str, Callable[[], Row]]] = [
        ("loader", lambda: check_loader(setting, work["cnn"])),
        (
            "channels_last",
            lambda: compare(
                setting,
                "channels_last",
                work["cnn"],
                "channels_last",
                {"channels_last": True},
                ByHand(channels_last=True),
                "fp32",
            ),
        ),
        (
            "amp bf16",
            lambda: (
                compare(
                    setting,
                    "amp bf16",
                    work["transformer"],
                    "amp",
                    {"amp": "bf16"},
                    ByHand(torch.bfloat16),
                    "bf16",
                )
                if bf16
                else Row("amp bf16", "skipped", f"no native bf16 on {dev.type}")
            ),
        ),
        ("amp fp16 + loss scaling", lambda: check_fp16_scaling(setting, work["transformer"])),
        (
            "accumulate",
            lambda: compare(
                setting,
                "accumulate",
                work["lstm"],
                "accumulate",
                {},
                ByHand(accumulate=2),
                "fp32",
                accumulate=2,
            ),
        ),
        ("checkpoint (memory budget)", lambda: check_memory_plan(setting, work["transformer"])),
        ("memory budget (does not fit)", lambda: check_memory_fit(setting, work["transformer"])),
        (
            "compile",
            lambda: (
                Row(
                    "compile",
                    "skipped",
                    "--quick on CPU: a cold compile takes tens of seconds; run without --quick",
                )
                if quick and dev.type == "cpu"
                else check_compile(setting, work["cnn"])
            ),
        ),
        ("distributed", lambda: check_distributed(setting, work["transformer"])),
    ]
    return checks


def run_check(name: str, check: Callable[[], Row]) -> Row:
    """One check's row; a check that raises is an `error` row (a broken pass is a finding of
    the selftest, not its crash)."""
    try:
        return check()
    except Exception as exc:
        return Row(name, "error", f"{type(exc).__name__}: {exc}"[:300])


# The report fits a terminal of this width; a longer explanation wraps between words.
WIDTH = 80
_STATUS, _CHECK = 9, 29  # column widths: "mismatch", "memory budget (does not fit)"
_INDENT = " " * _STATUS


def header(device: str, quick: bool, threads: int) -> str:
    """What the report is, said before the first check runs."""
    plural = "" if threads == 1 else "s"
    lines = [
        f"autoopt selftest on {device}, {'quick' if quick else 'full'} mode, "
        f"{threads} torch thread{plural}",
        *textwrap.wrap(
            "Each check trains a small model through optimize() with one pass on, and through "
            "the same loop written with torch's own tools; ok: the results match. speed: time "
            "by hand / time through optimize() (above 1: optimize() is faster).",
            WIDTH,
        ),
        "",
        f"{'result':<{_STATUS}}{'check':<{_CHECK}}{'speed':>6}  max diff (tolerance)",
    ]
    return "\n".join(lines) + "\n"


def row_lines(row: Row, verbose: bool = False) -> str:
    """One check: its line, then (wrapped, indented) why it is not ok or is slower than by
    hand; with `verbose` also what optimize() reported and the check's note."""
    speed = "" if row.speedup is None else f"{row.speedup:.2f}x"
    diff = "" if row.max_diff is None else f"{row.max_diff:.1e} ({row.tolerance:.0e})"
    lines = [f"{row.status:<{_STATUS}}{row.check:<{_CHECK}}{speed:>6}  {diff}".rstrip()]
    details = []
    if row.status != "ok":
        details.append("; ".join(part for part in (row.applied, row.note) if part))
    elif row.slow_reason():
        details.append(row.slow_reason())
    if verbose and row.status == "ok":
        details += [f"optimize() says: {row.applied}", row.note]
    for detail in filter(None, details):
        lines += textwrap.wrap(
            detail,
            WIDTH,
            initial_indent=_INDENT,
            subsequent_indent=_INDENT,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(lines) + "\n"


def verdict(rows: list[Row], seconds: float) -> str:
    """The last line: passed or how many failed, and how long it took; before it, once, what
    an ok slower than by hand means."""
    failed = sum(r.failed for r in rows)
    skipped = sum(r.status == "skipped" for r in rows)
    said = "all checks passed" if not failed else f"{failed} check(s) FAILED"
    extra = f", {skipped} skipped (not on this machine or mode)" if skipped else ""
    slower = any(r.slow_reason().startswith("slower than by hand") for r in rows)
    note = textwrap.wrap(SLOW_OK, WIDTH) if slower else []
    return "\n".join([*note, f"{said}{extra}; {seconds:.0f} s"]) + "\n"


def to_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def resolve_device(device: str | None) -> torch.device:
    """The device the checks run on: the one asked for, else CUDA (this rank's GPU under
    torchrun) if present, else the CPU."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None and "LOCAL_RANK" in os.environ:
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))  # torchrun: one GPU per rank
    return dev


@contextlib.contextmanager
def check_threads(quick: bool, device: str | None) -> Iterator[int]:
    """The torch intra-op threads the checks run with (yielded), restored afterwards: with
    `--quick` on the CPU one, for both loops alike. Its models are so small that more threads
    only add synchronisation, and on a busy machine the waits for a descheduled thread dominate
    the run (docs/diagnostics.md has the figures)."""
    before = torch.get_num_threads()
    threads = 1 if quick and resolve_device(device).type == "cpu" else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)


def describe_device(device: str | None) -> str:
    dev = resolve_device(device)
    if dev.type == "cuda":
        return f"{torch.cuda.get_device_name(dev)} (torch {torch.__version__})"
    from autoopt.runtime.hardware import cpu_model

    return f"CPU: {cpu_model()} (torch {torch.__version__})"


def finish(code: int) -> None:
    """End the selftest process with `code`. Under torchrun the process group the distributed
    check set up through optimize() is destroyed by optimize()'s own exit hook, before
    interpreter teardown (`distributed.destroy_own_group`): nothing to do here."""
    sys.exit(code)
