"""`# noqa` and `# autoopt: noqa` suppressions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autoopt.lint.engine.suppress import ALL, file_suppressions, filter_findings, line_suppressions


@dataclass
class F:
    code: str
    line: int


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("x = 1", None),
        ("x = 1  # noqa", ALL),
        ("x = 1  # NOQA", ALL),
        ("x = 1  # noqa: AO201", frozenset({"AO201"})),
        ("x = 1  # noqa:AO201,AO3", frozenset({"AO201", "AO3"})),
        ("x = 1  # noqa: AO201, F401  trailing words", frozenset({"AO201", "F401"})),
    ],
)
def test_line_suppressions(line: str, expected: frozenset[str] | None) -> None:
    assert line_suppressions(line) == expected


def test_filter_by_line_codes_and_prefixes() -> None:
    source = "a  # noqa: AO2\nb  # noqa: F401\nc  # noqa\nd\n"
    findings = [F("AO201", 1), F("AO101", 1), F("AO201", 2), F("AO999", 3), F("AO201", 4)]
    kept = filter_findings(findings, source)
    assert [(f.code, f.line) for f in kept] == [("AO101", 1), ("AO201", 2), ("AO201", 4)]


def test_file_level_suppression() -> None:
    assert file_suppressions("x = 1\n") is None
    assert file_suppressions("# autoopt: noqa\nx = 1\n") is ALL
    assert file_suppressions("import x\n  # autoopt: noqa: AO1, AO201\n") == {"AO1", "AO201"}
    # not on a line of its own (e.g. inside code) -> not a file-level suppression
    assert file_suppressions("x = 1  # autoopt: noqa\n") is None
    source = "# autoopt: noqa: AO1\nx\n"
    kept = filter_findings([F("AO101", 2), F("AO201", 2)], source)
    assert [f.code for f in kept] == ["AO201"]
    assert filter_findings([F("AO101", 2)], "# autoopt: noqa\nx\n") == []


def test_flake8_file_noqa_is_not_honoured() -> None:
    assert filter_findings([F("AO101", 2)], "# flake8: noqa\nx\n") == [F("AO101", 2)]
