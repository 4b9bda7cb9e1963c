"""The README shows real output: every ```console block is a command (`$ autoopt ...`) and what
it prints today, run from the repository root; the commands the README tells a newcomer to
type exist. A block that drifts from the tool's output fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONSOLE = re.compile(r"```console\n(.*?)```", re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for block in CONSOLE.findall(README):
        first, _, shown = block.partition("\n")
        assert first.startswith("$ autoopt "), f"a console block starts with its command: {first}"
        out.append((first[2:], shown))
    return out


def _normal(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@pytest.mark.parametrize(("command", "shown"), _blocks(), ids=[c for c, _ in _blocks()])
def test_console_block_is_what_the_command_prints(command: str, shown: str) -> None:
    args = command.split()[1:]
    done = subprocess.run(
        [sys.executable, "-m", "autoopt", *args, "--no-cache"]
        if args[0] == "lint"
        else [sys.executable, "-m", "autoopt", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )
    assert _normal(done.stdout + done.stderr) == _normal(shown)


def test_there_are_console_blocks() -> None:
    assert len(_blocks()) >= 3


def test_the_make_targets_the_readme_names_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"`make (\w+)", README):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"make {target}"
