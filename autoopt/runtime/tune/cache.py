"""The on-disk decision cache: `$AUTOOPT_CACHE_DIR/tune.json` (default
`~/.cache/autoopt/tune.json`), one entry per model structure, input signature, hardware, torch
and autoopt versions, fixed options and search space."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autoopt.runtime import hardware
from autoopt.runtime.options import Options
from autoopt.runtime.tune.plans import Plan, target_device

CACHE_ENV = "AUTOOPT_CACHE_DIR"
CACHE_FILE = "tune.json"
_CACHE_VERSION = 1


def cache_path() -> Path:
    """Where decisions are kept: $AUTOOPT_CACHE_DIR/tune.json, else ~/.cache/autoopt/."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return Path(root) / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoopt" / CACHE_FILE


def read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # absent or corrupt: measure again
    if not isinstance(data, dict) or data.get("version") != _CACHE_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def write(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Add one entry; written to a temp file and renamed so readers never see half a file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = read(path)
        entries[key] = entry
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"version": _CACHE_VERSION, "entries": entries}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home must not break training; the next run measures again


def decision_key(
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
        "inputs": batch_signature(batch),
        "hardware": hardware.signature(target_device(options, model)),
        "torch": torch.__version__,
        "autoopt": __version__,
        "options": fixed,
        "plans": [f"{type(p).__qualname__}:{p.label}" for p in plans],
    }
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def batch_signature(obj: Any) -> Any:
    """The structure of a batch with each tensor replaced by its shape, dtype and layout."""
    if isinstance(obj, torch.Tensor):
        return ["tensor", list(obj.shape), str(obj.dtype), str(obj.device.type)]
    if isinstance(obj, Mapping):
        return {
            str(k): batch_signature(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))
        }
    if isinstance(obj, list | tuple):
        return [type(obj).__name__, [batch_signature(v) for v in obj]]
    return type(obj).__name__
