"""Fixtures shared by the runtime tests."""

from __future__ import annotations

import pytest

from autoopt.runtime import hardware


@pytest.fixture
def fp32_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """`amp="auto"` resolves to fp32 on CPU: a CPU without native bf16 (faked, so on any CPU).
    The user did not ask for fp32 there, so the measured choices that `amp=False` stands down
    (compile="auto", the layout, the optimizer step's kernels) run, in fp32; a test of those
    choices passes amp="auto" with this fixture instead of amp=False."""
    monkeypatch.setattr(hardware, "cpu_supports_bf16", lambda: False)
