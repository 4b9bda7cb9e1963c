"""What `optimize()` did: one entry per pass, applied / skipped (why) / failed (fallback taken)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Status(str, Enum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class PassResult:
    """The outcome of one pass. `detail` says what was done, or why not, or what failed."""

    name: str
    status: Status
    detail: str
    fallback: str | None = None  # for FAILED: what autoopt did instead

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
    returns: a pass that fails lazily (compile at the first forward) records it here."""

    results: list[PassResult] = field(default_factory=list)

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
                return
        self.results.append(result)

    def applied(self) -> list[str]:
        return [r.name for r in self.results if r.status is Status.APPLIED]

    def to_dict(self) -> list[dict[str, str | None]]:
        return [
            {"pass": r.name, "status": r.status.value, "detail": r.detail, "fallback": r.fallback}
            for r in self.results
        ]

    def __str__(self) -> str:
        rows = [("pass", "status", "detail")]
        for r in self.results:
            detail = r.detail if r.fallback is None else f"{r.detail} -> {r.fallback}"
            rows.append((r.name, r.status.value, detail))
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        lines = [f"{a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
        lines.insert(1, f"{'-' * w0}  {'-' * w1}  {'-' * 6}")
        return "autoopt report\n" + "\n".join(lines)
