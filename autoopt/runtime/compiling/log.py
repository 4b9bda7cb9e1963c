"""What dynamo did while a compiled forward ran: graph breaks, recompiles and compile errors,
each at the user's file:line, read from the records torch keeps anyway.

At every graph break dynamo appends a `GraphCompileReason` (reason + user stack) to
`torch._dynamo.utils.graph_break_reasons`, and for every frame it compiles it records a
`CompilationMetrics` (function, file, first line, recompile reason, failure and its user frame;
`torch._dynamo.utils.get_compilation_metrics()`). Both only grow while a frame compiles, which
also bumps `counters["frames"]["total"]`. So `CompileWatch` compares that counter before and
after each call (two dict reads) and reads the records only when it moved: at the first call and
at recompiles, never on the steps in between. Nothing is enabled in torch's logging.
"""

from __future__ import annotations

import copy
import inspect
import os
import re
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._dynamo import utils as dynamo_utils

from autoopt.runtime.report import Event

# Frames in torch or in autoopt's own runtime (the forward chain dynamo enters through) are not
# the user's: events there are reported at the user's code instead.
_INTERNAL_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def _frames() -> int:
    return dynamo_utils.counters["frames"]["total"]


@dataclass(frozen=True)
class _Mark:
    """How far dynamo's records went at one moment."""

    frames: int
    breaks: int
    last_metrics: object | None

    @classmethod
    def now(cls) -> _Mark:
        metrics = dynamo_utils.get_compilation_metrics()
        return cls(
            _frames(), len(dynamo_utils.graph_break_reasons), metrics[-1] if metrics else None
        )


Where = tuple[str, int]  # (filename, line)


def code_origin(func: Any) -> Where:
    """Where a function's code starts: what a recompile of a region entered through torch's
    own wrappers (`nn.Module._call_impl`, dynamo's `wrap_inline`) is reported at."""
    code = inspect.unwrap(func).__code__
    return code.co_filename, code.co_firstlineno


class CompileWatch:
    """Call `before()` and `after()` around a call of a compiled function: `after()` returns
    the events of the compiles that call ran (none on a call that compiled nothing). `origin`
    is the user's code the compiled region starts at."""

    def __init__(self, origin: Where = ("?", 0)) -> None:
        self.origin = origin
        self.mark = _Mark.now()

    def before(self) -> None:
        if _frames() != self.mark.frames:  # something else compiled since our last call
            self.mark = _Mark.now()

    def after(self) -> list[Event]:
        if _frames() == self.mark.frames:
            return []
        events = events_since(self.mark, self.origin)
        self.mark = _Mark.now()
        return events


def events_since(mark: _Mark, origin: Where = ("?", 0)) -> list[Event]:
    """Graph breaks, then recompiles and compile errors, recorded after `mark`. A frame of
    torch's or autoopt's own (the wrapper dynamo entered the region through) is reported at
    `origin`."""
    reasons = dynamo_utils.graph_break_reasons
    start = mark.breaks if len(reasons) >= mark.breaks else 0  # 0: torch._dynamo.reset() ran
    events = [_graph_break(reason) for reason in reasons[start:]]
    metrics = dynamo_utils.get_compilation_metrics()
    ids = [id(m) for m in metrics]
    first = ids.index(id(mark.last_metrics)) + 1 if id(mark.last_metrics) in ids else 0
    for m in metrics[first:]:
        events += _metrics_events(m, origin)
    return list(dict.fromkeys(events))


def _graph_break(reason: Any) -> Event:
    frame = _user_frame(reason.user_stack)
    return Event(
        "graph break",
        frame.filename if frame else "?",
        (frame.lineno or 0) if frame else 0,
        _short(reason.reason),
    )


def _user_frame(stack: list[Any]) -> Any:
    """The innermost frame outside torch and autoopt (where the user's code called into what broke)."""
    for frame in reversed(stack):
        if not is_internal(frame.filename):
            return frame
    return stack[-1] if stack else None


def _metrics_events(m: Any, origin: Where) -> list[Event]:
    frame = (m.co_filename or "?", m.co_firstlineno or 0)
    if is_internal(frame[0]):
        frame = origin
    events = []
    if m.recompile_reason:
        events.append(Event("recompile", *frame, _first_line(m.recompile_reason)))
    if m.fail_type:
        failed_at = (m.fail_user_frame_filename, m.fail_user_frame_lineno)
        if failed_at[0] and failed_at[1] and not is_internal(failed_at[0]):
            frame = failed_at
        reason = f"{m.fail_type}: {_short(m.fail_reason or '')}"
        events.append(Event("compile error", *frame, reason))
    return events


def is_internal(filename: str) -> bool:
    """Whether a file is torch's or autoopt's own (not the user's code)."""
    return filename.startswith(_INTERNAL_DIRS)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _short(reason: str) -> str:
    """Dynamo's graph-break type plus its one-line explanation (hints and links dropped)."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return "unknown reason"
    explanation = next((ln for ln in lines if ln.startswith("Explanation:")), None)
    if explanation is None:  # a wrapper error ("backend='x' raised:") names the cause next
        return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return f"{lines[0]}: {explanation.removeprefix('Explanation:').strip()}"


def explain_compile(
    model: nn.Module, *batches: Any, backend: Any = "eager", **compile_options: Any
) -> list[Event]:
    """Compile a copy of `model` and run its forward on each batch; return the graph breaks,
    recompiles and compile errors dynamo met, each at the user's file:line.

    A batch is the forward's argument, or a tuple of its positional arguments. Pass batches of
    different shapes to see the recompiles they cause. The default backend "eager" runs dynamo's
    capture only (graph breaks and recompiles are dynamo's; the backend does not change them),
    so it costs little; pass `backend="inductor"` to see inductor's errors too. The copy keeps
    the model's own parameters, buffers and RNG state untouched. Compile errors are reported,
    not raised."""
    subject = copy.deepcopy(model)
    # Isolated: what an earlier compile of the same class cached would hide the breaks.
    options = {"isolate_recompiles": True, **compile_options}
    compiled = torch.compile(subject, backend=backend, **options)
    watch = CompileWatch(code_origin(type(subject).forward))
    events: list[Event] = []
    with torch.random.fork_rng(devices=[]):
        for batch in batches:
            args = batch if isinstance(batch, tuple) else (batch,)
            watch.before()
            try:
                compiled(*args)
            except Exception:  # noqa: BLE001 - the failure's record is in dynamo's metrics
                events += watch.after()
                break
            events += watch.after()
    return list(dict.fromkeys(events))


_SIZE_MISMATCH = re.compile(r"size mismatch at index (\d+)\. expected (\d+), actual (\d+)")


def shape_change(event: Event) -> tuple[int, int, int] | None:
    """(dim, old size, new size) of a recompile caused by an input's size changing (dynamo's
    "tensor 'x' size mismatch at index 0. expected 8, actual 5"); None for any other event."""
    if event.kind != "recompile":
        return None
    found = _SIZE_MISMATCH.search(event.reason)
    return (int(found[1]), int(found[2]), int(found[3])) if found else None


def user_call_site() -> Where:
    """The innermost frame of the current stack outside torch and autoopt: the user's line that
    called into them ("?" when there is none, e.g. on another thread)."""
    for frame in reversed(traceback.extract_stack()):
        if not is_internal(frame.filename):
            return frame.filename, frame.lineno or 0
    return "?", 0
