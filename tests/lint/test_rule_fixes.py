"""Every rule's examples, run through the fixer: INVALID examples with `fixed` text become exactly
that text, the output is stable under a second pass, and VALID examples are left alone."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import autoopt.rules
import libcst as cst
import pytest

from autoopt.lint.engine.rule import FixSafety, Invalid, Rule, Valid
from autoopt.lint.rewrite.apply import fix_source


def _all_rules() -> list[type[Rule]]:
    """Every rule of the `autoopt.rules` package (through the registry when it exists)."""
    try:
        from autoopt.lint.engine.registry import load_registry
    except ImportError:  # pragma: no cover - before the registry existed
        pass
    else:
        return load_registry().all()
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(autoopt.rules.__path__, "autoopt.rules."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__:
                found[obj.code] = obj
    return [found[code] for code in sorted(found)]


def _version(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    major, minor, *_ = text.split(".")
    return int(major), int(minor)


RULES = _all_rules()
FIXED_CASES = [
    pytest.param(rule, ex, id=f"{rule.code}-invalid{i}")
    for rule in RULES
    for i, ex in enumerate(rule.INVALID)
    if ex.fixed is not None
]
NOFIX_CASES = [
    pytest.param(rule, ex, id=f"{rule.code}-invalid{i}")
    for rule in RULES
    for i, ex in enumerate(rule.INVALID)
    if ex.fixed is None
]
VALID_CASES = [
    pytest.param(rule, ex, id=f"{rule.code}-valid{i}")
    for rule in RULES
    for i, ex in enumerate(rule.VALID)
]


def test_rules_are_discovered() -> None:
    assert RULES, "no rule found in autoopt.rules"
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize(("rule", "example"), FIXED_CASES)
def test_invalid_example_is_fixed(rule: type[Rule], example: Invalid) -> None:
    version = _version(example.target_version)
    result = fix_source(example.code, [rule], unsafe=True, target_version=version)
    assert not result.skipped, result.skipped  # a crash is contained, but still a bug
    assert result.source == example.fixed
    cst.parse_module(result.source)  # the output parses
    # One pass of the rule's fixes reaches the fixed point (pass 2 finds nothing to fix, else
    # RewriteError): a second fix_source call would be a no-op by construction.
    once = fix_source(example.code, [rule], unsafe=True, target_version=version, max_passes=2)
    assert once.source == example.fixed


@pytest.mark.parametrize(("rule", "example"), FIXED_CASES)
def test_fixed_example_matches_declared_safety(rule: type[Rule], example: Invalid) -> None:
    """Exactly as the example declares: a safe example (the default) is fixed by a plain
    `rewrite`; an `unsafe=True` one is left alone and its fix offered for --unsafe-fixes (which
    `test_invalid_example_is_fixed` applies)."""
    version = _version(example.target_version)
    result = fix_source(example.code, [rule], unsafe=False, target_version=version)
    if example.unsafe:
        assert result.source == example.code, "an unsafe fix was applied without --unsafe-fixes"
        assert result.unsafe_available, "the unsafe fix is not offered"
        assert all(f.fix_safety is FixSafety.UNSAFE for f in result.unsafe_available)
    else:
        assert result.source == example.fixed, "a safe fix was not applied by default"
        assert not result.unsafe_available


def test_examples_of_unsafe_rules_are_marked_unsafe() -> None:
    """A rule whose fixes are unsafe by default has no example claiming a safe fix unless one of
    its fixes is marked safe on purpose (flipping `fix_safety` then fails the examples)."""
    for rule in RULES:
        if rule.fix_safety is FixSafety.UNSAFE:
            fixed = [ex for ex in rule.INVALID if ex.fixed is not None]
            assert not fixed or any(ex.unsafe for ex in fixed), rule.code


@pytest.mark.parametrize(("rule", "example"), NOFIX_CASES)
def test_invalid_example_without_fixed_text_is_left_alone(
    rule: type[Rule], example: Invalid
) -> None:
    result = fix_source(
        example.code, [rule], unsafe=True, target_version=_version(example.target_version)
    )
    assert result.source == example.code
    assert not result.applied
    if example.message_contains is not None:  # a declined fix says why in the message
        messages = [f.message for f in [*result.declined, *result.unsafe_available]]
        assert any(example.message_contains in msg for msg in messages), messages


@pytest.mark.parametrize(("rule", "example"), VALID_CASES)
def test_valid_example_is_unchanged(rule: type[Rule], example: Valid) -> None:
    version = _version(example.target_version)
    result = fix_source(example.code, [rule], unsafe=True, target_version=version)
    assert not result.skipped, result.skipped
    assert result.source == example.code
    assert not result.applied
