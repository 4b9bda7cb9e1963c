"""`optimize(..., tune=True)`: choose the plan by measuring it.

What helps depends on the model and the machine (bf16 autocast wins big on a small CNN on a CPU
with AVX512-BF16, `torch.compile` makes a small transformer slower there), so a fixed recipe loses
somewhere. Tuning times every candidate plan on the user's own batches and keeps the fastest one
whose results agree with eager fp32.

How a candidate is measured:
- The model and optimizer are deep-copied together (so the copy of the optimizer holds the copy
  of the parameters); `optimize()` is applied to the copy with the candidate's options. The
  user's model, optimizer state, BatchNorm statistics and the global RNG states are left exactly
  as they were. The copies are freed after each candidate (peak memory: one extra copy).
- Dropout is switched off in the copies, so that a forward is deterministic and the outputs of a
  candidate can be compared with eager fp32's on the same batch.
- Batches: a few (`batches`, default 4) are drawn from a fresh iterator over the user's loader,
  then cycled. A re-iterable loader (a DataLoader, a list) is not consumed; the draw happens with
  the torch, Python and CUDA RNGs forked, so a shuffled loader's first epoch is the same as
  without tuning. A loader with workers starts them once for the draw. A one-shot iterator is not
  drawn from (that would eat the user's data): tuning is skipped with that reason.
- One step = forward, loss, backward, `optimizer.step()`. autoopt does not see the user's loss
  function, so the loss is inferred: a `loss` the model returns (Hugging Face style), else cross
  entropy when the batch's target is an integer class tensor that fits the output, else MSE when
  it is a float tensor of the output's shape, else a surrogate (mean of squares of the floating
  outputs). Pass `loss_fn` to `choose()` to use the real one.
- Acceptance: the first forward of the candidate (before any step) is compared with eager fp32 on
  the same batch: relative L2 error of the outputs and relative error of the loss must be within
  `rtol` (default 0.05, loose enough for bf16, tight enough to catch a broken plan); every loss of
  the timed steps must be finite; a pass that failed and fell back (e.g. compile) rejects the
  plan. The fastest accepted candidate (median ms/step over the timed steps) wins.
- Only options the user left on "auto" are searched; the others are held as given.

The decision is cached on disk (`$AUTOOPT_CACHE_DIR/tune.json`, default
`~/.cache/autoopt/tune.json`) keyed by the model's structure, the input signature, the hardware,
the torch and autoopt versions and the fixed options, so the next run starts at once. Delete the
file (or point AUTOOPT_CACHE_DIR elsewhere) to re-measure.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime as _dt
import hashlib
import itertools
import json
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from autoopt.runtime import hardware
from autoopt.runtime.batch import map_tensors
from autoopt.runtime.options import Options
from autoopt.runtime.report import PassResult, Status

NAME = "tune"
CACHE_ENV = "AUTOOPT_CACHE_DIR"
CACHE_FILE = "tune.json"
_CACHE_VERSION = 1
# The options tuning searches; the others (checkpoint, device, ...) are not speed choices.
SEARCHED = ("amp", "compile", "channels_last")

LossFn = Callable[[Any, Any], torch.Tensor]


# --- plans ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One candidate: values for the searched options of `optimize()`.

    Subclass and override `apply` to try something `optimize()` cannot express (the candidate is
    still measured and checked against eager fp32 like any other)."""

    amp: str | bool = False
    compile: str | bool = False
    channels_last: bool = False

    @property
    def label(self) -> str:
        parts = [str(self.amp)] if self.amp else []
        if self.compile:
            parts.append("compile" if self.compile is True else f"compile={self.compile}")
        if self.channels_last:
            parts.append("channels_last")
        return "+".join(parts) or "fp32"

    def options(self) -> dict[str, Any]:
        return {"amp": self.amp, "compile": self.compile, "channels_last": self.channels_last}

    def apply(
        self, model: nn.Module, batches: list[Any], optimizer: Any, options: Options
    ) -> tuple[nn.Module, Any, Any]:
        """Apply the plan to copies: returns (model, batches on the device, optimizer)."""
        from autoopt.runtime.optimize import optimize  # late: optimize imports this module

        kwargs = {
            name: getattr(options, name)
            for name in ("device", "checkpoint", "accumulate", "deterministic")
        }
        kwargs.update(self.options())
        # A list of batches is a loader optimize() wraps; it yields them moved and converted.
        got = optimize(model, list(batches), optimizer, **kwargs, distributed=False, verbose=False)
        if optimizer is None:
            model, loader = got
        else:
            model, loader, optimizer = got
        return model, list(loader), optimizer


REFERENCE = Plan()  # eager fp32: the baseline every candidate is checked against


def candidate_plans(model: nn.Module, options: Options) -> list[Plan]:
    """Every combination of the searched options left on "auto" that can pay on this machine;
    options the user set are held. The first plan is the most conservative one."""
    device = _target_device(options)
    amps: list[str | bool] = [False]
    if options.amp != "auto":
        amps = [options.amp]
    elif device.type == "cuda":
        amps.append("bf16" if hardware.cuda_supports_bf16(device) else "fp16")
    elif device.type == "cpu" and hardware.cpu_supports_bf16():
        amps.append("bf16")  # without native bf16 the CPU emulates it: slower, not a candidate
    compiles: list[str | bool] = [False, True] if options.compile == "auto" else [options.compile]
    has_conv = any(isinstance(m, nn.Conv2d) for m in model.modules())
    if options.channels_last == "auto":
        layouts = [False, True] if has_conv else [False]
    else:
        layouts = [bool(options.channels_last)]
    return [Plan(a, c, cl) for a, c, cl in itertools.product(amps, compiles, layouts)]


# --- results ----------------------------------------------------------------------------------


@dataclass
class Measurement:
    """What one candidate did: its median step time, or why it was rejected."""

    plan: str
    ms_per_step: float | None = None
    warmup_s: float | None = None
    output_error: float | None = None
    loss_error: float | None = None
    status: str = "ok"  # "ok" | "rejected: <why>" | "failed: <error>"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Decision:
    """The outcome of `choose()`: the options to run with and the report entry saying why."""

    options: Options
    result: PassResult
    plan: Plan | None = None
    measurements: list[Measurement] = field(default_factory=list)
    cache_hit: bool = False
    cache_path: Path | None = None


# --- the entry point --------------------------------------------------------------------------


def choose(
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer | None,
    options: Options,
    *,
    candidates: Sequence[Plan] | None = None,
    loss_fn: LossFn | None = None,
    batches: int = 4,
    warmup: int = 2,
    steps: int = 5,
    rtol: float = 0.05,
    cache: bool = True,
) -> Decision:
    """Measure candidate plans on copies and return the options `optimize()` should use.

    `options` are the user's; the returned `Decision.options` equal them with each searched
    "auto" option replaced by the chosen plan's value. Never raises because a candidate failed:
    when nothing can be measured, the user's options come back unchanged with a skipped or failed
    report entry. `loss_fn(outputs, target)` replaces the inferred loss; `candidates` replaces
    the search space (eager fp32 is always measured first as the reference)."""
    if steps < 1 or warmup < 0 or batches < 1:
        raise ValueError("tune needs steps >= 1, warmup >= 0 and batches >= 1")
    plans = list(candidates) if candidates is not None else candidate_plans(model, options)
    if not plans:
        return Decision(options, PassResult.skipped(NAME, "no candidate plans"))
    drawn, why_not = _draw(loader, batches)
    if not drawn:
        return Decision(options, PassResult.skipped(NAME, why_not))

    path = cache_path() if cache else None
    key = _cache_key(model, optimizer, drawn[0], options, plans)
    if path is not None:
        entry = _cache_read(path).get(key)
        plan = _find(plans, entry["plan"]) if entry else None
        if entry and plan is not None:
            measurements = [Measurement(**m) for m in entry["measurements"]]
            detail = (
                f"{plan.label} (cached {entry['created']} in {path}; delete it to re-measure)\n"
                + _table(measurements, plan)
            )
            return Decision(
                _with_plan(options, plan),
                PassResult.applied(NAME, detail),
                plan,
                measurements,
                cache_hit=True,
                cache_path=path,
            )

    measurements, chosen = _measure_all(
        model, optimizer, options, plans, drawn, loss_fn, warmup, steps, rtol
    )
    if chosen is None:
        errors = "; ".join(f"{m.plan}: {m.status}" for m in measurements)
        return Decision(
            options,
            PassResult.failed(NAME, f"no candidate could be measured ({errors})", "the defaults"),
            measurements=measurements,
        )
    eager = next((m for m in measurements if m.plan == REFERENCE.label and m.ok), None)
    speedup = ""
    if eager is not None and eager.ms_per_step and chosen[1].ms_per_step:
        speedup = f", {eager.ms_per_step / chosen[1].ms_per_step:.2f}x vs fp32 eager"
    detail = (
        f"{chosen[0].label}{speedup}; measured {len(plans)} plan(s) on {len(drawn)} batch(es), "
        f"{warmup} warm-up + {steps} timed step(s) each\n" + _table(measurements, chosen[0])
    )
    if path is not None:
        _cache_write(
            path,
            key,
            {
                "plan": chosen[0].label,
                "created": _dt.datetime.now().isoformat(timespec="seconds"),
                "measurements": [dataclasses.asdict(m) for m in measurements],
            },
        )
    return Decision(
        _with_plan(options, chosen[0]),
        PassResult.applied(NAME, detail),
        chosen[0],
        measurements,
        cache_path=path,
    )


# --- measuring --------------------------------------------------------------------------------


def _measure_all(
    model: nn.Module,
    optimizer: Any,
    options: Options,
    plans: list[Plan],
    batches: list[Any],
    loss_fn: LossFn | None,
    warmup: int,
    steps: int,
    rtol: float,
) -> tuple[list[Measurement], tuple[Plan, Measurement] | None]:
    """Reference first, then every plan; returns all measurements and the fastest accepted.

    When the copies fit in memory together, the timed steps run in interleaved rounds (one step
    of each candidate in turn), so a burst of load from other processes slows every candidate
    alike instead of penalising whichever happened to run then."""
    loss_fn = loss_fn or infer_loss
    todo = [REFERENCE] + [p for p in plans if p != REFERENCE]  # a Plan subclass never equals
    interleave = _fits_together(model, len(todo))
    trials: list[_Trial] = []
    with _rng_preserved():
        for plan in todo:
            trial = _Trial(plan, loss_fn)
            trial.start(model, optimizer, options, batches, warmup)
            if not interleave:
                trial.time(steps)
                trial.close()
            trials.append(trial)
            if plan is REFERENCE and not trial.result.ok:
                trial.close()
                return [trial.result], None  # fp32 eager cannot run on copies: nothing to compare
        if interleave:
            for _ in range(steps):
                for trial in trials:
                    trial.time(1)
            for trial in trials:
                trial.close()
    reference = trials[0]
    measurements: list[Measurement] = []
    accepted: list[tuple[Plan, Measurement]] = []
    for trial in trials:
        trial.judge(reference, rtol)
        m = trial.result
        if trial.plan is not REFERENCE or REFERENCE in plans:
            measurements.append(m)
        if m.ok and m.ms_per_step is not None and trial.plan in plans:
            accepted.append((trial.plan, m))
    if REFERENCE not in plans:
        measurements.insert(0, reference.result)  # shown for comparison, not a candidate
    return measurements, _simplest_within_noise(accepted)


# A plan must beat a simpler one by more than this to be chosen: differences below it are within
# the run-to-run noise of a few timed steps, and a choice made on noise is cached for good.
NOISE_MARGIN = 0.03


def _simplest_within_noise(
    accepted: list[tuple[Plan, Measurement]],
) -> tuple[Plan, Measurement] | None:
    """The fastest plan, unless a simpler one is within NOISE_MARGIN of it."""
    if not accepted:
        return None
    fastest = min(m.ms_per_step or math.inf for _, m in accepted)
    close = [
        (p, m) for p, m in accepted if (m.ms_per_step or math.inf) <= fastest * (1 + NOISE_MARGIN)
    ]
    return min(close, key=lambda pm: (_complexity(pm[0]), pm[1].ms_per_step or math.inf))


def _complexity(plan: Plan) -> int:
    """How much a plan changes: compile counts double (warm-up time, failure modes)."""
    if type(plan) is not Plan:  # a custom plan: rank it by time alone
        return 0
    return bool(plan.amp) + 2 * bool(plan.compile) + bool(plan.channels_last)


class _Trial:
    """One candidate on its own copies of the model and optimizer."""

    def __init__(self, plan: Plan, loss_fn: LossFn) -> None:
        self.plan = plan
        self.loss_fn = loss_fn
        self.result = Measurement(plan.label)
        self.model: nn.Module | None = None
        self.optimizer: Any = None
        self.batches: Iterator[Any] = iter(())
        self.sync_on: Any = None
        self.outputs: list[torch.Tensor] = []  # of the first forward, as fp32 on the CPU
        self.losses: list[float] = []
        self.times: list[float] = []
        self.failed_passes = ""

    def start(
        self, model: nn.Module, optimizer: Any, options: Options, batches: list[Any], warmup: int
    ) -> None:
        """Copy, apply the plan, run the first step (kept for comparison) and the warm-up."""
        try:
            self.model, self.optimizer = copy.deepcopy((model, optimizer))
        except Exception as err:  # a module holding an uncopyable object (a lock, a file, ...)
            self._fail(f"model/optimizer cannot be deep-copied ({_short(err)})")
            return
        _disable_dropout(self.model)
        try:
            start = time.perf_counter()
            self.model, device_batches, self.optimizer = self.plan.apply(
                self.model, batches, self.optimizer, options
            )
            self.model.train()
            self.sync_on = device_batches[0]
            self.batches = itertools.cycle(device_batches)
            # The first step's forward (before any update) is the one compared with fp32 eager.
            for i in range(max(warmup, 1)):
                self._step(keep=i == 0)
            self.result.warmup_s = round(time.perf_counter() - start, 3)
        except Exception as err:
            self._fail(_short(err))

    def time(self, steps: int) -> None:
        if self.model is None:
            return
        try:
            for _ in range(steps):
                t0 = time.perf_counter()
                self._step()
                self.times.append(time.perf_counter() - t0)
        except Exception as err:
            self._fail(_short(err))

    def close(self) -> None:
        """Read what the passes reported, then free the copies."""
        if self.model is not None:
            self.failed_passes = _failed_passes(self.model)
        self.model = self.optimizer = self.sync_on = None
        self.batches = iter(())

    def judge(self, reference: _Trial, rtol: float) -> None:
        """Set the status: ok, or rejected with the reason (a failure is already set)."""
        m = self.result
        if m.status != "ok":
            return
        m.ms_per_step = round(statistics.median(self.times) * 1000, 3) if self.times else None
        if self.failed_passes:
            m.status = f"rejected: {self.failed_passes}"
        elif not all(math.isfinite(x) for x in self.losses):
            m.status = "rejected: non-finite loss"
        elif reference is not self:
            m.output_error = _relative_error(self.outputs, reference.outputs)
            ref_loss = reference.losses[0]
            m.loss_error = round(abs(self.losses[0] - ref_loss) / max(abs(ref_loss), 1e-6), 6)
            worst = max(m.output_error, m.loss_error)
            if not math.isfinite(worst) or worst > rtol:
                m.status = f"rejected: differs from fp32 eager by {worst:.3g} > {rtol:g}"

    def _step(self, keep: bool = False) -> None:
        loss = _step(
            self.model,
            self.optimizer,
            next(self.batches),
            self.loss_fn,
            self.outputs if keep else None,
        )
        _sync(self.sync_on)
        self.losses.append(loss)

    def _fail(self, why: str) -> None:
        self.result.status = f"failed: {why}"
        self.close()


def _fits_together(model: nn.Module, copies: int) -> bool:
    """Whether `copies` copies of the model with gradients and Adam-like state (4x the
    parameters) fit in a third of the memory available on its device."""
    size = sum(
        t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers())
    )
    device = next(model.parameters(), torch.empty(0)).device
    if device.type == "cuda" or (device.type == "cpu" and torch.cuda.is_available()):
        try:
            available = torch.cuda.mem_get_info()[0]
        except RuntimeError:
            return False
    else:
        available = _available_host_memory()
    return copies * 4 * size < available / 3


def _available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0  # unknown: measure one candidate at a time


def _step(
    model: nn.Module,
    optimizer: Any,
    batch: Any,
    loss_fn: LossFn,
    keep_outputs: list[torch.Tensor] | None = None,
) -> float:
    """One training step; the forward's floating outputs go to `keep_outputs` (as fp32, CPU)."""
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    args, kwargs = _inputs(batch)
    outputs = model(*args, **kwargs)
    if keep_outputs is not None:
        keep_outputs.extend(t.detach().float().cpu() for t in _floating(outputs))
    loss = loss_fn(outputs, _target(batch))
    del outputs
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return float(loss.detach())


def infer_loss(outputs: Any, target: Any) -> torch.Tensor:
    """The loss tuning trains with when it is not given the user's: see the module docstring."""
    own = outputs.get("loss") if isinstance(outputs, Mapping) else getattr(outputs, "loss", None)
    if isinstance(own, torch.Tensor) and own.numel() == 1:
        return own.float()
    floats = _floating(outputs)
    if not floats:
        raise ValueError("the model returned no floating-point tensor to train on")
    out = floats[0].float()
    if isinstance(target, torch.Tensor):
        if not target.is_floating_point() and not target.is_complex() and out.ndim >= 2:
            if out.shape[:-1] == target.shape:  # (..., classes) logits, e.g. a language model
                return F.cross_entropy(out.flatten(0, -2), target.flatten().long())
            if out.shape[0] == target.shape[0] and out.shape[2:] == target.shape[1:]:
                return F.cross_entropy(out, target.long())  # (N, C, ...) as torch expects
        if target.is_floating_point() and target.shape == out.shape:
            return F.mse_loss(out, target.float())
    return sum((t.float().square().mean() for t in floats), torch.zeros((), device=out.device))


def _inputs(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What the model is called with: a tensor as is, the first item of an (x, y, ...) tuple or
    list, a dict's items as keyword arguments (the Hugging Face convention)."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields") and batch:
        return (batch[0],), {}
    return (batch,), {}


def _target(batch: Any) -> Any:
    if isinstance(batch, list | tuple) and not hasattr(batch, "_fields") and len(batch) >= 2:
        return batch[1]
    return None


def _floating(outputs: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def collect(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            found.append(t)
        return t

    map_tensors(outputs, collect)
    return found


def _relative_error(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Worst relative L2 error over the output tensors (inf when their shapes differ)."""
    if len(outputs) != len(reference):
        return math.inf
    worst = 0.0
    for out, ref in zip(outputs, reference, strict=True):
        if out.shape != ref.shape:
            return math.inf
        err = (out - ref).norm() / ref.norm().clamp_min(1e-12)
        worst = max(worst, float(err))
    return round(worst, 6)


def _disable_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            module.p = 0.0
        elif isinstance(module, nn.MultiheadAttention | nn.RNNBase):
            module.dropout = 0.0  # the float attribute these modules pass to the functional op


def _failed_passes(model: nn.Module) -> str:
    from autoopt.runtime.optimize import report  # late: optimize imports this module

    try:
        results = report(model).results
    except ValueError:  # a Plan subclass that did not go through optimize()
        return ""
    return "; ".join(f"{r.name} failed ({r.detail})" for r in results if r.status is Status.FAILED)


def _sync(batch: Any) -> None:
    devices = {t.device for t in _all_tensors(batch)}
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def _all_tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_tensors(obj, lambda t: found.append(t) or t)
    return found


def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".splitlines()[0]
    return text if len(text) <= 160 else text[:157] + "..."


# --- batches and RNG --------------------------------------------------------------------------


def _draw(loader: Any, n: int) -> tuple[list[Any], str]:
    """Up to `n` batches from a fresh iterator over `loader`, or ([], why not)."""
    if loader is None:
        return [], "no loader given: tuning measures plans on the loader's batches"
    # Even creating the iterator draws from the RNG (a DataLoader's base seed), so all of it
    # happens with the RNGs forked.
    with _rng_preserved():
        try:
            iterator = iter(loader)
        except TypeError:
            return [], f"the loader ({type(loader).__name__}) is not iterable"
        if iterator is loader:
            return [], "the loader is a one-shot iterator; drawing from it would consume it"
        try:
            drawn = list(itertools.islice(iterator, n))
        except Exception as err:
            return [], f"could not draw batches from the loader ({_short(err)})"
        finally:
            del iterator  # a worker loader shuts its workers down here
    if not drawn:
        return [], "the loader yielded no batches"
    return drawn, ""


@contextlib.contextmanager
def _rng_preserved() -> Iterator[None]:
    """Leave torch's (CPU and CUDA), Python's and numpy's RNGs as they were."""
    py_state = random.getstate()
    try:
        import numpy as np

        np_state: Any = np.random.get_state()
    except ImportError:
        np, np_state = None, None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)


# --- the cache --------------------------------------------------------------------------------


def cache_path() -> Path:
    """Where decisions are kept: $AUTOOPT_CACHE_DIR/tune.json, else ~/.cache/autoopt/."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root) / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoopt" / CACHE_FILE


def _cache_read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or corrupt: measure again
    if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _cache_write(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Add one entry; written to a temp file and renamed so readers never see half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _cache_read(path)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": _CACHE_VERSION, "entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home must not break training; the next run measures again


def _cache_key(
    model: nn.Module, optimizer: Any, batch: Any, options: Options, plans: list[Plan]
) -> str:
    from autoopt import __version__

    params = [
        (n, tuple(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()
    ]
    fixed = {n: repr(getattr(options, n)) for n in Options.names() if n not in ("verbose",)}
    parts = {
        "model": f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}",
        "params": params,
        "optimizer": type(optimizer).__qualname__ if optimizer is not None else None,
        "inputs": _signature(batch),
        "hardware": hardware_signature(_target_device(options)),
        "torch": torch.__version__,
        "autoopt": __version__,
        "options": fixed,
        "plans": [f"{type(p).__qualname__}:{p.label}" for p in plans],
    }
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _signature(obj: Any) -> Any:
    """The structure of a batch with each tensor replaced by its shape, dtype and layout."""
    if isinstance(obj, torch.Tensor):
        return ["tensor", list(obj.shape), str(obj.dtype), str(obj.device.type)]
    if isinstance(obj, Mapping):
        return {str(k): _signature(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [type(obj).__name__, [_signature(v) for v in obj]]
    return type(obj).__name__


def hardware_signature(device: torch.device) -> dict[str, Any]:
    """What identifies the machine for a cached decision."""
    sig: dict[str, Any] = {"device": device.type, "threads": torch.get_num_threads()}
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        sig["gpu"] = torch.cuda.get_device_name(index)
        sig["capability"] = list(torch.cuda.get_device_capability(index))
    else:
        sig["cpu"] = cpu_model()
        sig["features"] = hardware.cpu_features()
    return sig


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# --- helpers ----------------------------------------------------------------------------------


def _target_device(options: Options) -> torch.device:
    if options.device != "auto":
        return torch.device(options.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _with_plan(options: Options, plan: Plan) -> Options:
    """The user's options with each searched option that was "auto" set to the plan's value."""
    chosen = {k: v for k, v in plan.options().items() if getattr(options, k) == "auto"}
    return dataclasses.replace(options, **chosen)


def _find(plans: list[Plan], label: str) -> Plan | None:
    return next((p for p in plans if p.label == label), None)


def _table(measurements: list[Measurement], chosen: Plan) -> str:
    rows = [("plan", "ms/step", "warm-up s", "rel. err", "status")]
    for m in measurements:
        err = max((e for e in (m.output_error, m.loss_error) if e is not None), default=None)
        mark = "  <- chosen" if m.plan == chosen.label and m.ok else ""
        rows.append(
            (
                m.plan,
                f"{m.ms_per_step:.2f}" if m.ms_per_step is not None else "-",
                f"{m.warmup_s:.2f}" if m.warmup_s is not None else "-",
                f"{err:.2g}" if err is not None else "-",
                m.status + mark,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r[:4], widths, strict=True))
        )
        + "  "
        + r[4]
        for r in rows
    )
