"""Memory measured without autoopt's own counters: what the planner's figures are checked
against (`autoopt selftest`, benchmarks/memory_measured.py).

On CUDA the allocator's own peak (`torch.cuda.max_memory_allocated`). On the CPU torch's
profiler: with `profile_memory=True` every allocation is recorded with the allocator's running
total of the bytes it handed out since profiling began (`total_allocated`, the field torch's own
memory timeline reads). Neither shares code with the planner (parameter/gradient/state sizes
and saved-tensor hooks in autoopt.runtime.memory)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile


def _events(nodes: list[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _events(node.children)


# What torch's profiler (kineto, in C++) prints on the process's stderr at each start and stop,
# whatever its log level, and its warning that a block allocated before it started is freed
# inside (expected here: only the step's allocations are counted): noise in a report.
PROFILER_CHATTER = ("USDT:", "STAGE:")
PROFILER_WARNING = "allocated before the profiling started"


@contextlib.contextmanager
def profiler_quiet() -> Iterator[None]:
    """Keep the profiler's own lines (`PROFILER_CHATTER`) off the terminal: the process's stderr
    (file descriptor 2, which C++ writes to) goes to a file meanwhile, and every other line
    written there is passed on afterwards, so no warning or error is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [
                line
                for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                if not line.startswith(PROFILER_CHATTER) and PROFILER_WARNING not in line
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def allocated_peak(fn: Callable[[], Any]) -> int:
    """The most bytes the CPU allocator held at once during `fn()` beyond what it held before
    (torch's profiler memory events; tensors allocated earlier are not counted).

    The profiler's running total is the process's, not this session's: it goes on counting the
    blocks an earlier profiled run allocated and left alive (a first measurement's gradients),
    so the peak is taken above its level when `fn` began (the first event's total less its
    own size). Blocks allocated while no profiler ran are not in the total, and their frees
    are not seen: a step that frees one before its peak is counted as if it still held it."""
    from torch._C._profiler import _EventType  # the event kind torch's memory timeline reads

    with (
        profiler_quiet(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted(
        (e for e in _events(tree) if e.tag == _EventType.Allocation), key=lambda e: e.start_time_ns
    )
    if not events:
        return 0
    start = events[0].extra_fields.total_allocated - events[0].extra_fields.alloc_size
    return max(0, max(e.extra_fields.total_allocated for e in events) - start)


def cuda_peak(fn: Callable[[], Any], device: torch.device) -> int:
    """The most bytes the CUDA caching allocator held at once during `fn()` beyond what it held
    before (`torch.cuda.max_memory_allocated` after a reset, less `memory_allocated` at the
    start: cuBLAS workspaces and other buffers allocated earlier are not the step's)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights counted once)."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def resident(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters, gradients and optimizer state alive now, as torch's storages say."""
    tensors = [t for p in model.parameters() for t in (p, p.grad) if t is not None]
    tensors += [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return storage_bytes(tensors)


def step_peak(model: nn.Module, optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> int:
    """Peak bytes of one training `step` of `model`: the parameters, gradients and optimizer
    state resident when it begins (torch's storages) plus the allocator's peak of what the step
    allocates: CUDA's own counters on a GPU, torch's profiler on the CPU. A step that frees
    gradients (`zero_grad(set_to_none=True)`) and makes them again is counted twice for them
    on the CPU (the profiler does not see the free): call `zero_grad(set_to_none=True)` before,
    so the step begins as it would after its own zero_grad."""
    device = next(model.parameters()).device
    held = resident(model, optimizer)
    peak = cuda_peak(step, device) if device.type == "cuda" else allocated_peak(step)
    return held + peak
