"""`autoopt doctor`: what a user needs to know about this machine before tuning.

Versions (torch, CUDA, cuDNN), every visible device with its memory and capabilities, the GPU list
as `nvidia-smi -L` prints it, the CPU and the ISA features torch's kernels use, threads, the
environment variables that change behaviour, CUDA memory in use, and the plan `optimize()` would
make here. The plan is not re-derived: doctor runs `optimize()` itself on a probe model (or on
the user's model with `--model`) and reports what its passes decided and why, next to the
hardware facts from `autoopt.runtime.hardware` that those passes read.

With `--model` and an example input (`--input`, or the model's `example_input_array` as
Lightning names it), doctor also compiles a copy of the model with dynamo and lists its graph
breaks, recompiles and compile errors at their file:line (`autoopt.explain_compile`, the same
events `autoopt.report(model)` shows once a compiled model trained), and the memory plan of
one training step on that input (`autoopt.explain_memory`): each repeated block's saved bytes
plain / selective / full, which blocks `checkpoint="auto"` would checkpoint under the budget
(`--memory-budget`), and the step's parameter, gradient, optimizer-state and activation bytes
before and after.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from autoopt.lint.engine.config import ALLOW_PROJECT_RULES_ENV
from autoopt.runtime import hardware, voice
from autoopt.runtime.compiling import cache as compile_cache
from autoopt.runtime.tune import cache as tune_cache

# Environment variables that change what torch or autoopt do; autoopt's own are named where they
# are read, so that this list cannot miss one.
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG",
    "TORCH_LOGS",
    "TORCHINDUCTOR_CACHE_DIR",
    voice.DISABLE_ENV,
    voice.OPTIONS_ENV,
    compile_cache.ENV,
    tune_cache.CACHE_ENV,
    ALLOW_PROJECT_RULES_ENV,
)


def collect(
    model_spec: str | None = None,
    input_spec: str | None = None,
    memory_budget: int | str | None = "auto",
    *,
    model: nn.Module | None = None,
    example: Any = None,
) -> dict[str, Any]:
    """Everything doctor reports, as plain data (what `--json` prints). `model`/`example`:
    already loaded from the specs (the CLI loads them first, to fail fast on a bad spec)."""
    from autoopt import __version__

    info: dict[str, Any] = {
        "autoopt": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": _torch_info(),
        "cpu": _cpu_info(),
        "cuda_devices": _cuda_devices(),
        "nvidia_smi": _nvidia_smi(),
        "env": {name: os.environ.get(name) for name in ENV_VARS},
    }
    if model_spec is not None:
        if model is None:
            model = load_model(model_spec)
        info["model"] = summarize_model(model, model_spec)
        if example is None and input_spec:
            example = load_object(input_spec)
        info["compile"] = compile_events(model, example)
        info["memory"] = memory_section(model, example, memory_budget)
    info["plan"] = plan(model, memory_budget)
    return info


def compile_events(model: nn.Module, example: Any = None) -> dict[str, Any]:
    """Graph breaks, recompiles and compile errors dynamo meets on a copy of the model, run
    twice on the example input (a second call shows recompiles that Python state, not shapes,
    causes); `skipped` says why when there is no example input."""
    from autoopt.runtime.compiling.log import explain_compile

    def section(example: Any) -> dict[str, Any]:
        events = explain_compile(model, example, example)
        return {"events": [e.to_dict() for e in events], "text": [str(e) for e in events]}

    return _on_example(model, example, "graph breaks and recompiles", section)


def memory_section(
    model: nn.Module, example: Any = None, memory_budget: int | str | None = "auto"
) -> dict[str, Any]:
    """The memory plan of one training step on the example input (`explain_memory`, AdamW's
    state assumed); `skipped` says why when there is no example input or the forward failed."""
    from autoopt.runtime.memory_explain import explain_memory

    def section(example: Any) -> dict[str, Any]:
        explained = explain_memory(model, example, memory_budget=memory_budget)
        return {**explained.to_dict(), "text": explained.render()}

    return _on_example(model, example, "the memory plan", section)


def _on_example(
    model: nn.Module, example: Any, what: str, section: Callable[[Any], dict[str, Any]]
) -> dict[str, Any]:
    """`section(example)` with torch's and the passes' warnings silenced (the section says it
    all); the example defaults to the model's `example_input_array`. `skipped` says why when
    there is none or the forward failed on it."""
    if example is None:
        example = getattr(model, "example_input_array", None)
    if example is None:
        return {
            "skipped": "no example input: pass --input MODULE:ATTR (or set the model's "
            f"example_input_array) to see {what}"
        }
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return section(example)
    except Exception as err:  # the forward itself failed on the example: say so
        return {"skipped": f"the forward failed on the example input: {type(err).__name__}: {err}"}


def _torch_info() -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "device_count": torch.cuda.device_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mps_available": bool(
            getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
        ),
    }


def _cpu_info() -> dict[str, Any]:
    return {
        "model": hardware.cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": hardware.available_cpus(),
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "features": hardware.cpu_features(),
        "native_bf16": hardware.cpu_supports_bf16(),
    }


def _cuda_devices() -> list[dict[str, Any]]:
    devices = []
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(index)
        device = torch.device("cuda", index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 2),
                "capability": f"{props.major}.{props.minor}",
                "multiprocessors": props.multi_processor_count,
                "bf16": hardware.cuda_supports_bf16(device),
                "tf32": hardware.cuda_supports_tf32(device),
                "allocated_mib": round(torch.cuda.memory_allocated(index) / 2**20, 1),
                "reserved_mib": round(torch.cuda.memory_reserved(index) / 2**20, 1),
            }
        )
    return devices


def _nvidia_smi() -> list[str] | None:
    """`nvidia-smi -L`, line by line (None when the tool is not installed or fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line for line in out.stdout.splitlines() if line.strip()]


# --- the plan ---------------------------------------------------------------------------------


class _Probe(nn.Module):
    """A small conv + linear model: enough for every pass to say what it would do here."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean((2, 3)))


def plan(
    model: nn.Module | None = None, memory_budget: int | str | None = "auto"
) -> dict[str, Any]:
    """What `optimize()` would do here: run it (verbose off, distributed off, nothing trained)
    on a probe model, or on a deep copy of the user's, and return its report."""
    import copy

    from autoopt import optimize, report

    subject = "a small conv probe model" if model is None else "your model"
    try:
        target = _Probe() if model is None else copy.deepcopy(model)
        optimizer = torch.optim.AdamW(target.parameters(), lr=1e-3)
        # Passes print warnings of their own; doctor shows the report instead.
        with contextlib.redirect_stderr(io.StringIO()):
            target, _ = optimize(
                target,
                None,
                optimizer,
                distributed=False,
                memory_budget=memory_budget,
                verbose=False,
            )
        passes = report(target).to_dict()
    except Exception as err:
        return {"subject": subject, "error": f"{type(err).__name__}: {err}", "passes": []}
    return {"subject": subject, "passes": passes}


# --- --model ----------------------------------------------------------------------------------


def load_object(spec: str) -> Any:
    """`module:attr` -> what it names; a callable (class, factory) is called with no arguments.
    The current directory is importable, as for `python -m`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"want module:attr (e.g. mypkg.models:build), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module | torch.Tensor) and callable(obj):
        obj = obj()
    return obj


def load_model(spec: str) -> nn.Module:
    """`module:attr` -> the module it names: an nn.Module instance, or a class / factory called
    with no arguments."""
    obj = load_object(spec)
    if not isinstance(obj, nn.Module):
        raise TypeError(f"{spec} is a {type(obj).__name__}, not a torch.nn.Module")
    return obj


def summarize_model(model: nn.Module, name: str = "") -> dict[str, Any]:
    """Parameter counts, total and per top-level child (what torchsummary users look for).
    Lazy parameters not materialized yet have no size: they are counted apart (`lazy`)."""
    children = [
        {
            "name": child_name,
            "type": type(child).__name__,
            "params": sum(_numel(p) for p in child.parameters()),
        }
        for child_name, child in model.named_children()
    ]
    own = sum(_numel(p) for p in model.parameters(recurse=False))
    if own:
        children.append({"name": "(own parameters)", "type": "-", "params": own})
    params = list(model.parameters())
    return {
        "name": name or type(model).__name__,
        "type": type(model).__name__,
        "params": sum(_numel(p) for p in params),
        "trainable": sum(_numel(p) for p in params if p.requires_grad),
        "lazy": sum(is_lazy(p) for p in params),
        "size_mib": round(sum(_numel(p) * p.dtype.itemsize for p in params) / 2**20, 2),
        "children": children,
    }


def _numel(param: torch.Tensor) -> int:
    return 0 if is_lazy(param) else param.numel()


# --- text -------------------------------------------------------------------------------------


def render(info: dict[str, Any]) -> str:
    """The human-readable report."""
    t, cpu = info["torch"], info["cpu"]
    yes = {True: "yes", False: "no"}
    lines = [
        f"autoopt {info['autoopt']}  python {info['python']}  {info['platform']}",
        "",
        "torch",
        f"  version        {t['version']}",
        f"  CUDA           {t['cuda'] or 'none (CPU build)'}",
        f"  cuDNN          {t['cudnn'] or 'none'}",
        f"  CPU kernels    {t['cpu_capability']}",
        "",
        "CPU",
        f"  model          {cpu['model']}",
        f"  cores          {cpu['logical_cores']} logical, {cpu['usable_cores']} usable",
        f"  torch threads  {cpu['torch_threads']} intra-op, {cpu['interop_threads']} inter-op",
        "  features       " + " ".join(f"{k}={yes[v]}" for k, v in cpu["features"].items()),
        f"  native bf16    {yes[cpu['native_bf16']]} (AVX512-BF16 or AMX: bf16 autocast pays)",
        "",
        f"CUDA devices ({len(info['cuda_devices'])})",
    ]
    if not info["cuda_devices"]:
        lines.append("  none visible" + ("" if not t["cuda"] else " (check CUDA_VISIBLE_DEVICES)"))
    for d in info["cuda_devices"]:
        lines.append(
            f"  cuda:{d['index']}  {d['name']}  {d['memory_gib']} GiB  sm {d['capability']}  "
            f"bf16={yes[d['bf16']]} tf32={yes[d['tf32']]}  "
            f"allocated {d['allocated_mib']} MiB, reserved {d['reserved_mib']} MiB"
        )
    if info["nvidia_smi"]:
        lines += ["", "nvidia-smi -L", *(f"  {line}" for line in info["nvidia_smi"])]
    lines += ["", "environment"]
    width = max(map(len, info["env"]), default=0)
    lines += [
        f"  {k:<{width}}  {v if v is not None else '(unset)'}" for k, v in info["env"].items()
    ]
    if "model" in info:
        m = info["model"]
        lines += [
            "",
            f"model {m['name']} ({m['type']}): {m['params']:,} parameters "
            f"({m['trainable']:,} trainable, {m['size_mib']} MiB)"
            + (f"; {m['lazy']} lazy parameter(s) not materialized yet" if m["lazy"] else ""),
        ]
        width = max((len(c["name"]) for c in m["children"]), default=4)
        for c in m["children"]:
            lines.append(f"  {c['name']:<{width}}  {c['type']:<20} {c['params']:>12,}")
    if "compile" in info:
        c = info["compile"]
        lines += ["", "torch.compile of your model (dynamo, on a copy, twice on the example input)"]
        if "skipped" in c:
            lines.append(f"  not run: {c['skipped']}")
        else:
            lines += [f"  {text}" for text in c["text"]] or ["  no graph breaks or recompiles"]
    if "memory" in info:
        m = info["memory"]
        lines += ["", "memory plan of one training step (on a copy, on the example input)"]
        if "skipped" in m:
            lines.append(f"  not run: {m['skipped']}")
        else:
            lines += [f"  {text}" for text in m["text"]]
    p = info["plan"]
    lines += ["", f"what optimize() would do here (for {p['subject']})"]
    if "error" in p:
        lines.append(f"  could not run optimize(): {p['error']}")
    width = max((len(r["pass"]) for r in p["passes"]), default=4)
    for r in p["passes"]:
        detail = r["detail"] + (f" -> {r['fallback']}" if r.get("fallback") else "")
        lines.append(f"  {r['pass']:<{width}}  {r['status']:<8} {detail}")
    return "\n".join(lines)
