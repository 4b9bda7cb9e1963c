"""The README and docs/*.md show real output: every block that starts with a command
(`$ autoopt ...`) is a ```console block, and the test runs the command from the repository root
and compares what it prints today with what the page shows. A line `[...]` in a block stands for
any lines of output (a machine's own details), and `[...]` inside a line for any text; nothing
else may differ. The commands the README tells a newcomer to type exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
ANY = "[...]"
# Commands that take more than a few seconds (doctor runs optimize() on a probe model); the
# environment section they are checked for is checked fast by tests/diagnostics/test_doctor.py.
SLOW = ("autoopt doctor", "autoopt selftest", "autoopt bench")


def _blocks() -> list[tuple[str, str, str, str]]:
    """(page, language, command, what it shows) of every block that starts with a prompt."""
    out = []
    for page in PAGES:
        for language, body in FENCED.findall(page.read_text(encoding="utf-8")):
            first, _, shown = body.partition("\n")
            if first.startswith("$ "):
                out.append((page.relative_to(ROOT).as_posix(), language, first[2:], shown))
    return out


def _normal(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _pattern(shown: list[str]) -> re.Pattern[str]:
    """The output `shown` stands for: `[...]` lines match any lines, `[...]` in a line any text."""
    parts = []
    for line in shown:
        if line == ANY:
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(map(re.escape, line.split(ANY))) + r"\n")
    return re.compile("".join(parts))


def _cases() -> list:
    return [
        pytest.param(
            command,
            shown,
            id=f"{page}: {command}",
            marks=[pytest.mark.slow] if command.startswith(SLOW) else [],
        )
        for page, _, command, shown in _blocks()
    ]


@pytest.mark.parametrize(("command", "shown"), _cases())
def test_console_block_is_what_the_command_prints(command: str, shown: str) -> None:
    args = command.split()[1:]
    assert command.startswith("autoopt "), f"a console block runs autoopt: {command}"
    done = subprocess.run(
        [sys.executable, "-m", "autoopt", *args, "--no-cache"]
        if args[0] == "lint"
        else [sys.executable, "-m", "autoopt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )
    printed = "".join(line + "\n" for line in _normal(done.stdout + done.stderr))
    assert _pattern(_normal(shown)).fullmatch(printed), printed


def test_every_block_that_shows_a_command_is_checked() -> None:
    """A block that starts with `$ ` is fenced as console, so that the test above runs it."""
    loose = [(page, command) for page, language, command, _ in _blocks() if language != "console"]
    assert not loose, f"blocks with a command that are not ```console: {loose}"
    pages = {page for page, *_ in _blocks()}
    assert {"README.md", "docs/lint.md", "docs/diagnostics.md"} <= pages


def test_the_pattern_matches_what_it_should_and_nothing_else() -> None:
    shown = ["autoopt 0.1.0  python [...]", ANY, "environment", "  RANK  (unset)"]
    ok = "autoopt 0.1.0  python 3.11\ntorch\n  version 2\nenvironment\n  RANK  (unset)\n"
    assert _pattern(shown).fullmatch(ok)
    assert not _pattern(shown).fullmatch(ok.replace("(unset)", "0"))
    assert not _pattern(shown).fullmatch(ok + "extra\n")


def test_no_rule_shows_a_raw_placeholder() -> None:
    """A message is printed as written by `autoopt rules` and docs/rules.md: no `{name}`."""
    rules = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8").splitlines()
    said = [line for line in rules if line.startswith(("| [AO", "Message: "))]
    assert len(said) > 80  # the table's row and the "Message:" line of every rule
    assert not [line for line in said if re.search(r"\{[a-z_]+\}", line)]


def test_the_make_targets_the_readme_names_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"`make (\w+)", README):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"make {target}"
