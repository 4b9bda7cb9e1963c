"""The Ruff conventions a Ruff user tries first: lint --fix/--diff/--show-fixes, standard input
with --stdin-filename, --output-file, --extend-exclude, "No Python files found", a named file
that is not Python, and the exit codes that go with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from autoopt.cli import main

SCRIPT = """\
import torch
from torch.utils.data import DataLoader

loader = DataLoader(list(range(8)), batch_size=2)
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    optimizer.zero_grad(set_to_none=False)
    model(x.float().view(-1, 1).repeat(1, 2)).sum().backward()
    optimizer.step()
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def lint(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["lint", "--no-cache", *args], input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_stdin_is_linted_under_its_filename(project: Path) -> None:
    code, out, _ = lint("-", "--stdin-filename", "train.py", "--select", "AO406", stdin=SCRIPT)
    assert code == 1
    assert out.startswith("train.py:8:")
    assert "AO406" in out
    code, out, _ = lint("-", "--select", "AO406", stdin="import torch\n")
    assert code == 0, out


def test_stdin_follows_the_config_of_its_filename(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.autoopt]\nselect = ["AO4"]\n[tool.autoopt.per-file-ignores]\n"train*" = ["AO406"]\n'
    )
    code, out, _ = lint("-", "--stdin-filename", "train.py", stdin=SCRIPT)
    assert code == 0 and "AO406" not in out, out
    code, out, _ = lint("-", "--stdin-filename", "other.py", stdin=SCRIPT)
    assert code == 1 and "AO406" in out, out


def test_fix_applies_the_safe_fixes_and_diff_exits_1(project: Path) -> None:
    code, out, _ = lint("--diff", "--select", "AO406", "train.py")
    assert code == 1
    assert "-    optimizer.zero_grad(set_to_none=False)" in out
    assert (project / "train.py").read_text() == SCRIPT
    code, out, _ = lint("--fix", "--select", "AO406", "train.py")
    assert code == 0
    assert out == "Found 1 finding (1 fixed, 0 remaining).\n"
    assert "zero_grad()" in (project / "train.py").read_text()
    code, out, _ = lint("--diff", "--select", "AO406", "train.py")
    assert code == 0 and out == ""


def test_show_fixes_lists_each_fix_with_its_safety(project: Path) -> None:
    code, out, _ = lint("--select", "AO406,AO101", "--show-fixes", "train.py")
    assert code == 1
    fixes = out.split("Fixes (")[1]
    assert "AO406 (" in fixes and "AO101 (unsafe)" in fixes


def test_output_file_gets_the_findings(project: Path) -> None:
    code, out, _ = lint("--select", "AO406", "-o", "report.txt", "train.py")
    assert code == 1 and out == ""
    assert "train.py:8:" in (project / "report.txt").read_text()


def test_extend_exclude_on_the_command_line_and_in_config(project: Path) -> None:
    (project / "vendored").mkdir()
    (project / "vendored" / "other.py").write_text(SCRIPT)
    code, out, _ = lint("--select", "AO406", ".")
    assert "vendored" in out
    code, out, _ = lint("--select", "AO406", "--extend-exclude", "vendored/", ".")
    assert "vendored" not in out and "train.py" in out
    (project / "pyproject.toml").write_text('[tool.autoopt]\nextend-exclude = ["vendored/"]\n')
    code, out, _ = lint("--select", "AO406", ".")
    assert "vendored" not in out and "train.py" in out


def test_no_python_files_is_a_warning(project: Path) -> None:
    (project / "empty").mkdir()
    code, _, err = lint("empty")
    assert code == 0
    assert "No Python files found under empty" in err


def test_a_named_file_that_is_not_python_is_an_error(project: Path) -> None:
    (project / "data.json").write_text("{}")
    code, _, err = lint("data.json")
    assert code == 2
    assert "not a Python file (.json)" in err


def test_version_line_is_the_program_and_its_version() -> None:
    from autoopt import __version__

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"autoopt {__version__}\n"


def test_rule_is_explain_under_ruffs_name() -> None:
    explained = CliRunner().invoke(main, ["explain", "AO406"])
    ruled = CliRunner().invoke(main, ["rule", "AO406"])
    assert ruled.exit_code == 0 and ruled.stdout == explained.stdout
    assert ruled.stdout.startswith("# AO406")


def test_rewrite_of_standard_input_writes_the_result_to_standard_output(project: Path) -> None:
    args = ["rewrite", "-", "--stdin-filename", "train.py", "--select", "AO406"]
    result = CliRunner().invoke(main, args, input=SCRIPT)
    assert result.exit_code == 0, result.output
    assert result.stdout == SCRIPT.replace("zero_grad(set_to_none=False)", "zero_grad()")
    diff = CliRunner().invoke(main, [*args, "--diff"], input=SCRIPT)
    assert diff.exit_code == 1
    assert diff.stdout.startswith("--- a/train.py\n+++ b/train.py\n")
    check = CliRunner().invoke(main, [*args, "--check"], input=SCRIPT)
    assert check.exit_code == 1 and check.stdout == ""


def test_fix_prints_what_remains_and_exits_1(project: Path) -> None:
    """A CI step or pre-commit hook running `lint --fix` fails while findings remain (Ruff)."""
    code, out, _ = lint("--fix", "--select", "AO406,AO101", "train.py")
    assert "zero_grad()" in (project / "train.py").read_text()  # the safe fix was applied
    assert code == 1, out
    assert "train.py:4:10: AO101 " in out  # the unsafe one remains, and is shown
    assert "Found 2 findings (1 fixed, 1 remaining)." in out
    assert "fixable with `autoopt lint --fix --unsafe-fixes`" in out
    code, out, _ = lint("--fix", "--select", "AO406,AO101", "--exit-zero", "train.py")
    assert code == 0 and "AO101" in out


def test_exit_non_zero_on_fix_fails_when_something_was_fixed(project: Path) -> None:
    code, _, _ = lint("--fix", "--exit-non-zero-on-fix", "--select", "AO406", "train.py")
    assert code == 1
    code, _, _ = lint("--fix", "--exit-non-zero-on-fix", "--select", "AO406", "train.py")
    assert code == 0  # nothing left to fix, nothing fixed


def test_fix_of_standard_input_writes_the_source_to_stdout(project: Path) -> None:
    """An editor's fix-on-save: the fixed source on stdout, what remains on stderr."""
    args = ("--fix", "-", "--stdin-filename", "train.py", "--select", "AO406,AO101")
    code, out, err = lint(*args, stdin=SCRIPT)
    assert out == SCRIPT.replace("zero_grad(set_to_none=False)", "zero_grad()")
    assert code == 1
    assert "train.py:4:10: AO101 " in err and "(1 fixed, 1 remaining)" in err
    code, out, _ = lint("--diff", "-", "--select", "AO406", stdin=SCRIPT)
    assert code == 1 and "+    optimizer.zero_grad()" in out


def test_json_fix_edits_make_the_change_rewrite_makes(project: Path) -> None:
    from tests.lint.test_output import apply_edits

    code, out, _ = lint("--select", "AO406", "--output-format", "json", "train.py")
    (entry,) = json.loads(out)
    edits = entry["fix"]["edits"]
    assert edits and entry["fix"]["applicability"] == "safe"
    rewritten = CliRunner().invoke(main, ["rewrite", "-", "--select", "AO406"], input=SCRIPT)
    assert apply_edits(SCRIPT, edits) == rewritten.stdout
    lines = lint("--select", "AO406", "--output-format", "json-lines", "train.py")[1]
    assert json.loads(lines)["fix"]["edits"] == edits


def test_color_follows_the_flag_then_no_color_then_force_color(project: Path) -> None:
    def colored(*args: str, **env: str) -> bool:
        result = CliRunner().invoke(
            main, ["lint", "--no-cache", "--select", "AO406", *args, "train.py"], env=env
        )
        return "\x1b[" in result.stdout

    assert not colored()  # not a terminal
    assert colored(FORCE_COLOR="1")
    assert not colored(FORCE_COLOR="1", NO_COLOR="1")
    assert colored("--color", "always", NO_COLOR="1")
    assert not colored("--color", "never", FORCE_COLOR="1")


def test_verbose_says_the_config_rules_and_files(project: Path) -> None:
    code, _, err = lint("-v", "--select", "AO406", "train.py")
    assert code == 1
    assert f"autoopt: config: {project / 'pyproject.toml'}" in err
    assert "autoopt: 1 rule selected: AO406" in err
    assert "autoopt: checked 1 file in " in err


def test_per_file_ignores_on_the_command_line(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.autoopt]\n[tool.autoopt.per-file-ignores]\n"train*" = ["AO406"]\n'
    )
    assert lint("--select", "AO406", "train.py")[0] == 0  # the config's table
    code, out, _ = lint("--select", "AO406", "--per-file-ignores", "other*:AO4", "train.py")
    assert code == 1 and "AO406" in out  # the command line's replaces it
    extended = ("--extend-per-file-ignores", "other*:AO4", "train.py")
    assert lint("--select", "AO406", *extended)[0] == 0  # extends it
    code, _, err = lint("--select", "AO406", "--per-file-ignores", "train*:AO999", "train.py")
    assert code == 2 and "AO999" in err
    code, _, err = lint("--per-file-ignores", "train.py", "train.py")
    assert code == 2 and "expected PATTERN:CODES" in err
    assert rewrite_stdin("--per-file-ignores", "*:AO406").stdout == SCRIPT  # rewrite too


def rewrite_stdin(*args: str) -> Result:
    return CliRunner().invoke(
        main,
        ["rewrite", "-", "--stdin-filename", "train.py", "--select", "AO406", *args],
        input=SCRIPT,
    )


def test_add_noqa_silences_every_finding_in_place(project: Path) -> None:
    source = SCRIPT.replace("batch_size=2)", "batch_size=2)  # keep small") + (
        'optimizer.zero_grad(set_to_none=False); note = """a\nmultiline string"""\n'
    )
    (project / "train.py").write_text(source)
    code, _, err = lint("--add-noqa", "--select", "AO406,AO101", "train.py")
    assert code == 0 and "Added 2 noqa directives." in err
    assert "train.py:11: no noqa added" in err  # the line ends inside a string
    text = (project / "train.py").read_text()
    assert "batch_size=2)  # keep small  # noqa: AO101\n" in text
    assert "zero_grad(set_to_none=False)  # noqa: AO406\n" in text
    code, out, _ = lint("--select", "AO406,AO101", "train.py")
    assert code == 1 and out.count("AO406") == 1  # only the finding in the string's line
    (project / "train.py").write_text(SCRIPT.replace("False)", "False)  # noqa: E501"))
    lint("--add-noqa", "--select", "AO406", "train.py")
    assert "False)  # noqa: E501, AO406\n" in (project / "train.py").read_text()
