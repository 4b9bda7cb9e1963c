"""AO001 (Ruff's RUF100): a noqa code that names no rule, or suppresses nothing on its line,
judged against the raw findings of the rules that ran."""

from __future__ import annotations

from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.runner import lint_bytes

SOURCE = """\
import torch
from torch.utils.data import DataLoader
loader = DataLoader(ds, batch_size=2)  # noqa: AO101
loader = DataLoader(ds, batch_size=2, num_workers=2)  # noqa: AO101
x = 1  # noqa: AO999, F401
s = "# noqa: AO998"
loader = DataLoader(ds, batch_size=2, num_workers=2)  # noqa: AO1
"""


def _codes_by_line(select: list[str]) -> dict[int, list[str]]:
    registry = load_registry()
    rules = [registry.find(code) for code in select]
    result = lint_bytes(SOURCE.encode(), "train.py", rules)
    assert not result.errors, result.errors
    out: dict[int, list[str]] = {}
    for d in result.diagnostics:
        out.setdefault(d.line, []).append(d.code)
    return out


def test_unused_and_unknown_codes_are_reported_and_used_ones_are_not() -> None:
    found = _codes_by_line(["AO101", "AO001"])
    assert 3 not in found  # AO101 fired there and was suppressed: the noqa is used
    assert found[4] == ["AO001"]  # num_workers given: AO101 is silent, its noqa is stale
    assert found[5] == ["AO001"]  # AO999 names no rule; F401 is another linter's
    assert 6 not in found  # inside a string: no comment at all
    assert found[7] == ["AO001"]  # a prefix that suppresses nothing is stale too


def test_a_code_of_a_rule_that_did_not_run_is_not_called_unused() -> None:
    found = _codes_by_line(["AO001"])
    assert 3 not in found and 4 not in found and 7 not in found
    assert found[5] == ["AO001"]
