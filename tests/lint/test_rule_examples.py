"""Detection tests generated from every rule's examples (Fixit-style).

VALID examples must not be flagged by their rule; INVALID ones must be flagged with the rule's
code at the example's `line` (and with `message_contains` in the message, when set), for the
example's `target_version`. The cases come from the registry, so a rule file added to `rules/`
is tested without touching this file. The fixture rules of the engine tests run through the
same checks, so the generator itself is always exercised.
"""

from __future__ import annotations

import pytest

from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.config import parse_target_version
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.rule import Invalid, Rule, Valid

from .fixtures import load_fixture_rules


def _rules() -> list[type[Rule]]:
    return [*load_registry().all(), *load_fixture_rules().all()]


def _cases() -> list[object]:
    cases: list[object] = []
    for rule in _rules():
        for i, valid in enumerate(rule.VALID):
            cases.append(pytest.param(rule, valid, id=f"{rule.code}-valid{i}"))
        for i, invalid in enumerate(rule.INVALID):
            cases.append(pytest.param(rule, invalid, id=f"{rule.code}-invalid{i}"))
    return cases


def _version(example: Valid | Invalid) -> tuple[int, int] | None:
    text = getattr(example, "target_version", None)
    return parse_target_version(text) if text else None


@pytest.mark.parametrize(("rule", "example"), _cases())
def test_example(rule: type[Rule], example: Valid | Invalid) -> None:
    analysis = analyze(example.code, "example.py", [rule], _version(example))
    assert not analysis.crashes, analysis.crashes[0].describe()  # contained, but still a bug
    findings = [f for f in analysis.findings if f.code == rule.code]
    if isinstance(example, Valid):
        assert not findings, (
            f"{rule.code} flagged valid code at line(s) {[f.line for f in findings]}"
        )
        return
    lines = [f.line for f in findings]
    assert example.line in lines, f"{rule.code} expected at line {example.line}, got {lines}"
    if example.message_contains is not None:
        messages = [f.message for f in findings if f.line == example.line]
        assert any(example.message_contains in m for m in messages), messages


def test_every_rule_has_examples() -> None:
    missing = [r.code for r in _rules() if not r.VALID or not r.INVALID]
    assert not missing, f"rules without VALID and INVALID examples: {missing}"
