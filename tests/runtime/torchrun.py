"""Two-process runs of a worker script under torchrun (gloo on CPU), for the DDP, FSDP and
accumulate tests: each rank writes `rank<N>.json` into the output folder."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

# What torchrun sets; cleared before launching so that an outer launcher's values do not leak in.
TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def load_worker(path: Path) -> ModuleType:
    """The worker script as a module, for the constants and model factories it defines."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_two_processes(worker: Path, out: Path, timeout: int = 300) -> list[dict[str, Any]]:
    """`torchrun --standalone --nproc_per_node=2 worker out`; the two ranks' JSON results."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port picked by torchrun itself
        "--nproc_per_node=2",
        str(worker),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
