"""Two-process runs of a worker script under torchrun (gloo on CPU), for the DDP, FSDP and
accumulate tests: each rank writes `rank<N>.json` into the output folder."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
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
    """`torchrun --standalone --nproc_per_node=2 worker out`; the two ranks' JSON results.

    Past `timeout` the ranks get SIGABRT, so each prints its Python stacks (faulthandler) into
    the failure message, and the launcher SIGTERM: none is left running."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",  # a free port picked by torchrun itself
        "--nproc_per_node=2",
        str(worker),
        str(out),
    ]
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The ranks run in sessions of their own (torchrun's choice): signal them by pid.
            for rank in _children(proc.pid):
                os.kill(rank, signal.SIGABRT)
            proc.terminate()
            stdout, stderr = proc.communicate()
            raise AssertionError(
                f"torchrun did not finish in {timeout} s; stacks:\n{stderr[-12000:]}"
            ) from None
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _children(pid: int) -> list[int]:
    """The process ids whose parent is `pid` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The fields after the command's closing parenthesis: state, then the parent's id.
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.parent.name))
    return found
