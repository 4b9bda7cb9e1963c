"""What `optimize()` did: one entry per pass, applied / skipped (why) / failed (fallback taken),
and what a pass saw in the user's code while training ran (compile: graph breaks, recompiles)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from autoopt.runtime import voice
from autoopt.runtime.memory import MemoryPlan, StepMemory


class Status(str, Enum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class Event:
    """Something a pass saw at a place in the user's code, e.g. a graph break at model.py:12."""

    kind: str  # "graph break", "recompile", "compile error"
    filename: str
    lineno: int
    reason: str

    def __str__(self) -> str:
        path = self.filename
        if os.path.isabs(path) and path.startswith(os.getcwd() + os.sep):
            path = os.path.relpath(path)
        return f"{self.kind} at {path}:{self.lineno}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "file": self.filename,
            "line": self.lineno,
            "reason": self.reason,
        }


@dataclass
class PassResult:
    """The outcome of one pass. `detail` says what was done, or why not, or what failed;
    `events` what it saw in the user's code after `optimize()` returned."""

    name: str
    status: Status
    detail: str
    fallback: str | None = None  # for FAILED: what autoopt did instead
    events: list[Event] = field(default_factory=list)
    # What the pass measured, by name, in seconds or bytes (e.g. {"bf16_s": 0.036}), for loggers.
    figures: dict[str, float] = field(default_factory=dict)

    @classmethod
    def applied(cls, name: str, detail: str) -> PassResult:
        return cls(name, Status.APPLIED, detail)

    @classmethod
    def skipped(cls, name: str, reason: str) -> PassResult:
        return cls(name, Status.SKIPPED, reason)

    @classmethod
    def failed(cls, name: str, error: str, fallback: str) -> PassResult:
        return cls(name, Status.FAILED, error, fallback)


@dataclass
class Report:
    """All pass results, in the order the passes ran. Entries may change after `optimize()`
    returns: a pass that fails lazily (compile at the first forward) records it here, and
    `memory` is filled in by the first training step when checkpointing plans under a budget."""

    results: list[PassResult] = field(default_factory=list)
    # A step's bytes per rank before and after the memory passes (None: none of them planned).
    memory: MemoryPlan | None = None
    # Set once optimize() has shown the report: a later decision is then said when it is made.
    published: bool = False
    verbose: bool = True
    # Options the AUTOOPT_OPTIONS environment variable set over the call's.
    overrides: dict[str, Any] = field(default_factory=dict)

    def add(self, result: PassResult) -> PassResult:
        self.results.append(result)
        return result

    def __getitem__(self, name: str) -> PassResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no pass named {name!r}; passes: {[r.name for r in self.results]}")

    def __contains__(self, name: object) -> bool:
        return any(r.name == name for r in self.results)

    def replace(self, result: PassResult) -> None:
        """Overwrite the entry of the same pass (used when a pass fails after optimize returned)."""
        for i, old in enumerate(self.results):
            if old.name == result.name:
                self.results[i] = result
                break
        else:
            self.results.append(result)
        if self.published:
            voice.say(
                f"autoopt: {result.name} {result.status.value}: {_detail(result)}", self.verbose
            )

    def note(self, name: str, events: list[Event]) -> list[Event]:
        """Add events to the entry of pass `name`, each once; returns the new ones."""
        result = self[name]
        new = [e for e in dict.fromkeys(events) if e not in result.events]
        result.events.extend(new)
        return new

    def applied(self) -> list[str]:
        return [r.name for r in self.results if r.status is Status.APPLIED]

    def to_dict(self) -> list[dict[str, Any]]:
        """One dict per pass with fixed keys, for loggers (TensorBoard, W&B, Lightning's):
        `pass`, `status` (applied/skipped/failed), `applied` (bool), `reason` (why skipped or
        what failed; None when applied), `detail`, `fallback`, `figures` (what it measured) and
        `events` (graph breaks, recompiles)."""
        return [
            {
                "pass": r.name,
                "status": r.status.value,
                "applied": r.status is Status.APPLIED,
                "reason": None if r.status is Status.APPLIED else r.detail,
                "detail": r.detail,
                "fallback": r.fallback,
                "figures": dict(r.figures),
                "events": [e.to_dict() for e in r.events],
            }
            for r in self.results
        ]

    def __str__(self) -> str:
        rows = [("pass", "status", "detail")]
        for r in self.results:
            rows.append((r.name, r.status.value, _detail(r)))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        head, *body = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
        lines = [head, f"{'-' * w0}  {'-' * w1}  {'-' * 6}"]
        for result, line in zip(self.results, body, strict=True):
            lines.append(line)
            lines += [f"{'':<{w0}}  {'':<{w1}}  - {e}" for e in result.events]
        if self.memory is not None:
            lines += ["", *self.memory.render()]
        if self.overrides:
            shown = ", ".join(f"{k}={v!r}" for k, v in self.overrides.items())
            lines += ["", f"options set by AUTOOPT_OPTIONS: {shown}"]
        return "autoopt report\n" + "\n".join(lines)


def _detail(result: PassResult) -> str:
    return result.detail if result.fallback is None else f"{result.detail} -> {result.fallback}"


def record_plan(
    report: Report, before: StepMemory, after: StepMemory, budget: int | None
) -> MemoryPlan:
    """Add one pass's before/after bytes of a step to `report.memory` (the memory section that
    `autoopt.report(model)` prints) and return the combined plan."""
    plan = (
        MemoryPlan(before, after, budget)
        if report.memory is None
        else report.memory.combine(before, after, budget)
    )
    report.memory = plan
    return plan
