"""Every subcommand against a table of bad inputs: never a traceback, exit 2 with a message that
names the problem, and `lint` and `rewrite` (inline fixes or `--wrap`) saying the same words.

Each row is one kind of bad input a new user meets in the first hour; each column a subcommand,
with the argument that input becomes for it (a path for lint and rewrite, the code for
explain/rule, `--model`/`--workload` for doctor and bench). Commands that take no path refuse one
as a usage error. Ruff's convention is kept where it differs from "exit 2": a folder with no
Python in it is a warning and exit 0, for lint and rewrite alike.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from autoopt.cli import main

from .test_cli_lint import unreadable

NOTEBOOK = {
    "cells": [{"cell_type": "code", "metadata": {}, "source": ["x = 1\n"], "outputs": []}],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def _files(root: Path) -> None:
    (root / "ok.py").write_text("x = 1\n")
    (root / "syntax.py").write_text("x = (\n")
    (root / "notes.txt").write_text("not python\n")
    (root / "binary.py").write_bytes(b"\x00\xff\x00\x01")
    (root / "empty").mkdir()
    (root / "empty" / "README.md").write_text("no Python here\n")
    (root / "broken.ipynb").write_text("{not json")
    (root / "good.ipynb").write_text(json.dumps(NOTEBOOK))
    (root / "locked.py").write_text("x = 1\n")


@dataclass(frozen=True)
class Bad:
    """One bad input: the path it is (or the code), what lint and rewrite say, their exit code."""

    arg: str
    says: str
    code: int = 2
    stdin: str | None = None
    select: str | None = None  # an unknown code given to --select
    bad_config: bool = False


ROWS: dict[str, Bad] = {
    "missing path": Bad("nosuch.py", "nosuch.py:1:1: error: no such file or folder"),
    "standard input": Bad("-", "-:1:5: error: syntax error: '(' was never closed", stdin="x = (\n"),
    "folder of no Python": Bad(
        "empty", "autoopt: warning: No Python files found under empty", code=0
    ),
    "binary file": Bad("binary.py", "binary.py:1:1: error: binary file: contains NUL bytes"),
    "syntax error": Bad("syntax.py", "syntax.py:1:5: error: syntax error: '(' was never closed"),
    ".txt file": Bad("notes.txt", "autoopt: error: notes.txt: not a Python file (.txt)"),
    "broken notebook": Bad("broken.ipynb", "broken.ipynb:1:2: error: invalid notebook JSON"),
    "unreadable file": Bad("locked.py", "locked.py:1:1: error: cannot read: Permission denied"),
    "bad config": Bad("ok.py", "unknown key `selct`; did you mean `select`?", bad_config=True),
    "unknown code": Bad(
        "ok.py", "unknown rule selector 'AO999' in the command-line options", select="AO999"
    ),
}

# Subcommand -> (argv for a bad input, or None where the input means nothing to it; what it says
# when that is not the row's own message).
Column = Callable[[Bad], tuple[list[str], str | None] | None]


def _paths(*command: str) -> Column:
    def argv(bad: Bad) -> tuple[list[str], str | None]:
        select = ["--select", bad.select] if bad.select else []
        return [*command, *select, bad.arg], None

    return argv


def _code(command: str) -> Column:
    def argv(bad: Bad) -> tuple[list[str], str | None]:
        if bad.bad_config:
            return [command, "AO201"], None
        code = bad.select or bad.arg
        return [command, code], f"unknown rule '{code}'"

    return argv


def _no_paths(command: str) -> Column:
    def argv(bad: Bad) -> tuple[list[str], str | None] | None:
        if bad.bad_config:
            return ([command], None) if command == "rules" else None
        return [command, bad.select or bad.arg], "Got unexpected extra argument"

    return argv


def _doctor(bad: Bad) -> tuple[list[str], str | None] | None:
    if bad.bad_config or bad.select:
        return None  # doctor reads no [tool.autoopt] and selects no rules
    module = bad.arg if bad.arg == "-" else Path(bad.arg).stem
    return ["doctor", "--model", f"{module}:build"], "Invalid value for --model"


def _bench(bad: Bad) -> tuple[list[str], str | None] | None:
    if bad.bad_config:
        return None
    if bad.arg == "nosuch.py":  # a missing path: where the results were to be written
        return ["bench", "--json", "nosuch/out.json"], "the folder"
    if bad.select:
        return ["bench", "--config", bad.select], "Invalid value for --config"
    return ["bench", "--workload", bad.arg], "Invalid value for --workload"


COLUMNS: dict[str, Column] = {
    "lint": _paths("lint", "--no-cache"),
    "lint --diff": _paths("lint", "--diff"),
    "lint --fix": _paths("lint", "--fix", "--no-cache"),
    "rewrite": _paths("rewrite"),
    "rewrite --diff": _paths("rewrite", "--diff"),
    "rewrite --wrap": _paths("rewrite", "--wrap"),
    "explain": _code("explain"),
    "rule": _code("rule"),
    "rules": _no_paths("rules"),
    "doctor": _doctor,
    "bench": _bench,
    "selftest": _no_paths("selftest"),
}


@pytest.fixture
def bad_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The bad inputs in a project folder (the current one); `sys.path` and `sys.modules` come
    back as they were (doctor imports `--model`'s module from the current folder)."""
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    unreadable(monkeypatch, "locked.py")
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - modules:
        if name in {"syntax", "binary", "locked", "ok", "empty", "nosuch", "good", "broken"}:
            del sys.modules[name]


def invoke(root: Path, bad: Bad, argv: list[str]) -> Result:
    if bad.bad_config:
        (root / "pyproject.toml").write_text('[tool.autoopt]\nselct = ["AO1"]\n')
    return CliRunner().invoke(main, argv, input=bad.stdin)


CELLS = [
    (row, column) for row in ROWS for column in COLUMNS if COLUMNS[column](ROWS[row]) is not None
]


@pytest.mark.parametrize(("row", "column"), CELLS, ids=[f"{c}-{r}" for r, c in CELLS])
def test_a_bad_input_is_refused_in_words_never_a_traceback(
    bad_project: Path, row: str, column: str
) -> None:
    bad = ROWS[row]
    spec = COLUMNS[column](bad)
    assert spec is not None
    argv, says = spec
    result = invoke(bad_project, bad, argv)
    output = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    assert "Traceback" not in output, output
    assert result.exit_code == (bad.code if says is None else 2), output
    assert (says or bad.says) in output, output


def _said(result: Result) -> list[str]:
    """The lines that say what was wrong (not the summaries, which differ by command)."""
    return [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "error:" in line or "warning:" in line
    ]


@pytest.mark.parametrize("row", list(ROWS))
def test_lint_and_rewrite_say_the_same(bad_project: Path, row: str) -> None:
    bad = ROWS[row]
    said = {}
    for column in (
        "lint",
        "lint --fix",
        "lint --diff",
        "rewrite",
        "rewrite --diff",
        "rewrite --wrap",
    ):
        spec = COLUMNS[column](bad)
        assert spec is not None
        result = invoke(bad_project, bad, spec[0])
        said[column] = (result.exit_code, _said(result))
    assert len(set(map(str, said.values()))) == 1, said


def test_a_good_notebook_is_linted_and_left_alone_by_rewrite(bad_project: Path) -> None:
    linted = CliRunner().invoke(main, ["lint", "--no-cache", "good.ipynb"])
    assert linted.exit_code == 0, linted.output
    rewritten = CliRunner().invoke(main, ["rewrite", "good.ipynb"])
    assert rewritten.exit_code == 0, rewritten.output
    assert "skipped: good.ipynb: notebooks are not rewritten" in rewritten.stderr


LEGACY_ASYNC = """\
import torch

model = torch.nn.Linear(4, 2).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.utils.data.DataLoader(dataset, batch_size=8):
    x, y = x.cuda(), y.cuda(async=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
"""


def test_a_pre_37_async_keyword_is_linted_as_if_renamed_and_never_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """speech-commands: `targets.cuda(async=True)` (torch < 0.4) is a syntax error since
    Python 3.7. lint reads the file as if the keyword were renamed (same positions), says so
    where it is, and offers no fix; rewrite leaves the file as it is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEGACY_ASYNC)
    linted = CliRunner().invoke(main, ["lint", "--no-cache", "--output-format", "json", "train.py"])
    assert linted.exit_code == 2, linted.output
    entries = json.loads(linted.stdout)
    codes = {e["code"] for e in entries if e["code"]}
    assert {"AO103", "AO201"} <= codes
    assert all(e["fix"] is None for e in entries if e["code"])
    (error,) = [e for e in entries if e["code"] is None]
    assert "`async=` is a keyword since Python 3.7" in error["message"]
    assert error["message"].startswith("LegacySyntax: ")
    assert error["location"] == {"row": 6, "column": 29}  # at `async`
    copy = next(e for e in entries if e["code"] == "AO103")
    assert copy["location"]["row"] == 6  # the original's positions
    text = CliRunner().invoke(main, ["lint", "--no-cache", "train.py"])
    assert "parsed only as older Python reads it" in text.output
    rewritten = CliRunner().invoke(main, ["rewrite", "--unsafe-fixes", "train.py"])
    assert rewritten.exit_code == 2
    assert (tmp_path / "train.py").read_text() == LEGACY_ASYNC


LEGACY_TABS = (
    "import torch\n\n"
    "def train(model, loader, optimizer):\n"
    "    for x, y in loader:\n"
    "        x = x.cuda()\n"
    "       \ty = y.cuda()\n"
    "        with torch.no_grad():\n"
    "    \t    z = x\n"
    "        loss = torch.nn.functional.cross_entropy(model(z), y)\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
)


def test_indentation_that_mixes_tabs_python_reads_is_linted_expanded_and_never_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """improved-wgan-pytorch: lines indented with spaces and a tab (`       \ty = ...`), which
    Python reads (a tab to the next 8-column stop) and libcst's tokenizer rejects ("no matching
    outer block for dedent"): the file was a syntax error with no finding. lint reads it with
    the tabs expanded, says so at the first such line, offers no fix; rewrite leaves it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LEGACY_TABS)
    linted = CliRunner().invoke(main, ["lint", "--no-cache", "--output-format", "json", "train.py"])
    assert linted.exit_code == 2, linted.output
    entries = json.loads(linted.stdout)
    codes = {e["code"] for e in entries if e["code"]}
    assert {"AO103", "AO201"} <= codes, entries
    assert all(e["fix"] is None for e in entries if e["code"])
    (error,) = [e for e in entries if e["code"] is None]
    assert "mixes tabs and spaces" in error["message"]
    # titled as the input's, not autoopt's fault (the corpus harness counted it as internal)
    assert error["message"].startswith("LegacySyntax: ")
    assert error["location"]["row"] == 6  # the first line whose indentation holds a tab
    rewritten = CliRunner().invoke(main, ["rewrite", "--unsafe-fixes", "train.py"])
    assert rewritten.exit_code == 2
    assert (tmp_path / "train.py").read_text() == LEGACY_TABS
