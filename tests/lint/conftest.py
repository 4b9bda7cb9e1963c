"""The fixture projects here name the fixture rules in their own `extra-rules`: they are trusted
(test_trust.py checks what happens to an untrusted project)."""

from __future__ import annotations

import pytest

from autoopt.lint.engine.config import ALLOW_PROJECT_RULES_ENV


@pytest.fixture(autouse=True)
def trust_fixture_projects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_PROJECT_RULES_ENV, "1")
