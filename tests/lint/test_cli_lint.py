"""`autoopt lint`, `rules`, `explain` as users run them: output, exit codes, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from autoopt.cli import main
from autoopt.lint.engine import registry as registry_module

from .fixtures import keep_cwd, write_project

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


@pytest.fixture(autouse=True)
def only_fixture_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI sees the fixture rules (via extra-rules) and no built-in ones."""
    monkeypatch.setattr(registry_module, "BUILTIN_PACKAGE", None)


def unreadable(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Reading the file called `name` fails as a chmod 000 file does for a non-root user. A
    monkeypatch, not chmod: CI runs as root, which chmod does not stop."""
    read_bytes = Path.read_bytes

    def deny(self: Path) -> bytes:
        if self.name == name:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", deny)


def run(root: Path, *args: str) -> Result:
    os.chdir(root)
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_exit_codes(tmp_path: Path) -> None:
    write_project(tmp_path / "clean", {"a.py": "x = 1\n"})
    write_project(tmp_path / "dirty", {"a.py": "print(1)\n"})
    write_project(tmp_path / "broken", {"a.py": "print(1\n", "b.py": "print(2)\n"})
    clean = run(tmp_path / "clean", "lint")
    assert clean.exit_code == 0 and "All checks passed!" in clean.output
    dirty = run(tmp_path / "dirty", "lint")
    assert dirty.exit_code == 1 and "a.py:1:1: XT201 print() in a training script" in dirty.output
    assert "\x1b[" not in dirty.output  # no colour off a terminal
    assert run(tmp_path / "dirty", "lint", "--exit-zero").exit_code == 0
    broken = run(tmp_path / "broken", "lint")
    assert broken.exit_code == 2
    assert "b.py:1:1: XT201" in broken.output  # the other file was still linted
    assert run(tmp_path / "broken", "lint", "--exit-zero").exit_code == 0
    assert run(tmp_path / "dirty", "lint", "--ignore", "XT2").exit_code == 0


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--select", "XT9"], "unknown rule selector 'XT9'"),
        (["--target-version", "banana"], "is not a torch version"),
        (["--output-format", "xml"], "Invalid value for '--output-format'"),
        (["--config", "missing.toml"], "does not exist"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    write_project(tmp_path, {"a.py": "print(1)\n"})
    result = run(tmp_path, "lint", *args)
    assert result.exit_code == 2 and words in result.output


def test_config_error_exits_2(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "print(1)\n"}, config="colour = true\n")
    result = run(tmp_path, "lint")
    assert result.exit_code == 2 and "unknown key `colour`" in result.output


def test_bad_input_each_reported_others_linted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_project(
        tmp_path,
        {
            "syntax.py": "def f(:\n    print(1)\n",
            "latin1.py": b"print('caf\xe9')\n",
            "binary.py": bytes(range(256)) * 4,
            "empty.py": "",
            "good.py": "print(1)\n",
            "locked.py": "print(2)\n",
        },
    )
    unreadable(monkeypatch, "locked.py")
    result = run(tmp_path, "lint", "--no-cache")
    out = result.output
    assert result.exit_code == 2
    assert "syntax.py:1:7: error: syntax error" in out
    assert "latin1.py:1:11: error: cannot decode as utf-8: invalid byte 0xe9" in out
    assert "binary.py:1:1: error: binary file: contains NUL bytes" in out
    assert "empty.py" not in out
    assert "good.py:1:1: XT201" in out
    assert "locked.py:1:1: error: cannot read: Permission denied" in out


def test_unreadable_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_project(tmp_path, {"locked.py": "print(2)\n", "ok.py": "print(1)\n"})
    unreadable(monkeypatch, "locked.py")
    result = run(tmp_path, "lint")
    assert result.exit_code == 2
    assert "locked.py:1:1: error: cannot read: Permission denied" in result.output
    assert "ok.py:1:1: XT201" in result.output


def test_per_file_ignores_and_exclude(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "train.py": "print(1)\nx.cuda()\n",
            "tests/test_a.py": "print(1)\nx.cuda()\n",
            "legacy/old.py": "print(1)\n",
        },
        config='exclude = ["legacy/"]\nper-file-ignores = { "tests/*" = ["XT2"] }\n',
    )
    result = run(tmp_path, "lint", "--output-format", "json")
    found = sorted(
        (os.path.relpath(e["filename"], tmp_path), e["code"]) for e in json.loads(result.output)
    )
    assert found == [("tests/test_a.py", "XT101"), ("train.py", "XT101"), ("train.py", "XT201")]
    # Named explicitly, an excluded file is linted, unless --force-exclude (pre-commit).
    assert run(tmp_path, "lint", "legacy/old.py").exit_code == 1
    assert run(tmp_path, "lint", "--force-exclude", "legacy/old.py").exit_code == 0


def test_noqa_and_file_level_suppression(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "a.py": "print(1)  # noqa: XT201\nx.cuda()  # noqa\nprint(2)\n",
            "b.py": "# autoopt: noqa\nprint(1)\n",
            "c.py": "# autoopt: noqa: XT1\nx.cuda()\nprint(1)\n",
        },
    )
    lines = run(tmp_path, "lint", "-q").output.splitlines()
    assert lines == [
        "a.py:3:1: XT201 print() in a training script",
        "c.py:3:1: XT201 print() in a training script",
    ]


def test_target_version_option(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "opt.zero_grad()\n"})
    assert run(tmp_path, "lint", "--target-version", "1.13").exit_code == 1
    assert run(tmp_path, "lint", "--target-version", "2.0").exit_code == 0


def test_statistics_and_formats(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "print(1)\nprint(2)\nx.cuda()\n"})
    stats = run(tmp_path, "lint", "--statistics", "-q")
    assert stats.output.splitlines() == ["2\tXT201\tprint-call", "1\tXT101\t[*] cuda-call"]
    sarif = json.loads(run(tmp_path, "lint", "--output-format", "sarif").output)
    assert sarif["version"] == "2.1.0" and len(sarif["runs"][0]["results"]) == 3
    github = run(tmp_path, "lint", "--output-format", "github").output
    assert github.count("::warning file=a.py,") == 3


def test_rules_command(tmp_path: Path) -> None:
    write_project(tmp_path, {})
    text = run(tmp_path, "rules")
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert lines[0].split() == ["CODE", "NAME", "FIX", "MESSAGE"]
    assert lines[1].split()[:3] == ["XT101", "cuda-call", "safe"]
    assert lines[3].split()[:3] == ["XT301", "old-zero-grad", "unsafe"]
    data = json.loads(run(tmp_path, "rules", "--output-format", "json").output)
    assert [(r["code"], r["fix"]) for r in data] == [
        ("XT101", "safe"),
        ("XT201", "none"),
        ("XT301", "unsafe"),
    ]
    assert data[2]["torch_versions"] == "< 2.0" and data[2]["url"].endswith("#xt301")


def test_explain_command(tmp_path: Path) -> None:
    write_project(tmp_path, {})
    result = run(tmp_path, "explain", "xt301")
    assert result.exit_code == 0
    out = result.output
    assert out.startswith("# XT301: old-zero-grad\n")
    assert "Fix: unsafe (applied with `--unsafe-fixes`) — code reading .grad" in out
    assert "Flags `opt.zero_grad()` without `set_to_none` before torch 2.0." in out
    assert "Flagged (line 1):\n```python\nopt.zero_grad()\n```" in out
    assert "Not flagged:" in out
    assert run(tmp_path, "explain", "print-call").exit_code == 0  # by name too
    unknown = run(tmp_path, "explain", "XT1O1")
    assert unknown.exit_code == 2 and "did you mean XT101" in unknown.output


def test_pre_commit_hook_definition() -> None:
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "- id: autoopt-lint" in text
    assert "language: python" in text
    assert "types_or: [python, jupyter]" in text
    assert "entry: autoopt lint --force-exclude --no-follow" in text  # staged files only


@pytest.mark.slow
def test_real_command_in_a_subprocess(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "print(1)\n"})
    command = [
        sys.executable,
        "-m",
        "autoopt",
        "lint",
        "--select",
        "XT2",
        "--output-format",
        "json",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert [e["code"] for e in json.loads(done.stdout)] == ["XT201"]
