"""docs/rules.md (where every rule's URL points) is what `autoopt rules -o markdown` prints today."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.engine.registry import load_registry, rule_url

ROOT = Path(__file__).resolve().parents[2]


def test_rules_reference_is_current() -> None:
    result = CliRunner().invoke(main, ["rules", "--output-format", "markdown"])
    assert result.exit_code == 0, result.output
    assert (ROOT / "docs" / "rules.md").read_text() == result.output, "run `make docs`"


def test_every_rule_url_has_an_anchor_in_the_reference() -> None:
    text = (ROOT / "docs" / "rules.md").read_text()
    for rule in load_registry().all():
        anchor = rule_url(rule).rsplit("#", 1)[1]
        assert f'<a id="{anchor}"></a>' in text, rule.code
