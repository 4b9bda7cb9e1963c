"""Linting an untrusted checkout runs none of its code: the `extra-rules` its own config names
are imported only when the user opts in (--allow-project-rules or AUTOOPT_ALLOW_PROJECT_RULES)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.engine.config import ALLOW_PROJECT_RULES_ENV

HOSTILE_RULE = '''
import pathlib
pathlib.Path({marker!r}).write_text("imported")

from autoopt.lint.engine.rule import Rule


class Evil(Rule):
    """Looks like a rule."""

    code = "EV101"
    name = "evil"
    message = "evil"
    triggers = ("print",)

    def visit_Call(self, node):
        self.report(node)
'''


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cloned repository whose pyproject names a rules folder that writes a marker file."""
    repo = tmp_path / "repo"
    (repo / "tools" / "r").mkdir(parents=True)
    marker = tmp_path / "PWNED"
    (repo / "tools" / "r" / "evil.py").write_text(HOSTILE_RULE.format(marker=str(marker)))
    (repo / "pyproject.toml").write_text('[tool.autoopt]\nextra-rules = ["tools/r"]\n')
    (repo / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(repo)
    monkeypatch.delenv(ALLOW_PROJECT_RULES_ENV, raising=False)
    return repo


@pytest.mark.parametrize("command", ["lint", "rewrite", "rules"])
def test_project_rules_are_not_imported_without_opt_in(checkout: Path, command: str) -> None:
    args = [command] if command == "rules" else [command, "--select", "ALL", "."]
    result = CliRunner().invoke(main, args)
    assert not (checkout.parent / "PWNED").exists()
    assert "not loading the extra-rules of" in result.stderr
    assert "--allow-project-rules" in result.stderr and ALLOW_PROJECT_RULES_ENV in result.stderr
    assert "EV101" not in result.stdout


def test_project_rules_load_with_the_flag(checkout: Path) -> None:
    result = CliRunner().invoke(main, ["lint", "--no-cache", "--allow-project-rules", "."])
    assert (checkout.parent / "PWNED").read_text() == "imported"
    assert "train.py:1:1: EV101 evil" in result.stdout
    assert "not loading" not in result.stderr


def test_project_rules_load_with_the_environment_variable(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW_PROJECT_RULES_ENV, "1")
    result = CliRunner().invoke(main, ["lint", "--no-cache", "."])
    assert (checkout.parent / "PWNED").exists() and "EV101" in result.stdout
