"""The bundled examples run on CPU and train: their loss falls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAIVE = sorted((ROOT / "examples" / "naive").glob("*.py"))


def epoch_losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"^epoch \d+ loss ([-\d.e]+)", output, re.M)]


def run_script(path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("script", NAIVE, ids=lambda p: p.stem)
def test_naive_script_trains(script: Path) -> None:
    losses = epoch_losses(run_script(script, "--epochs", "3", "--steps", "6"))
    assert len(losses) == 3
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("example", ["cnn.py", "transformer_lm.py"])
def test_optimize_example_compares_both_ways(example: str) -> None:
    out = run_script(ROOT / "examples" / example, "--compare", "--steps", "4")
    rates = re.findall(r"(eager|autoopt):\s+([\d.]+) steps/s\s+loss ([\d.]+) -> ([\d.]+)", out)
    assert [r[0] for r in rates] == ["eager", "autoopt"], out
    assert all(float(r[1]) > 0 for r in rates)
    assert re.search(r"speed-up: [\d.]+x", out)


REWRITTEN = ROOT / "examples" / "rewritten"


def test_rewritten_examples_are_what_the_tool_produces_today(tmp_path: Path) -> None:
    work = tmp_path / "rewritten"
    work.mkdir()
    for script in NAIVE:
        (work / script.name).write_text(script.read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "autoopt", "rewrite", "--unsafe-fixes", str(work)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for script in NAIVE:
        expected = (REWRITTEN / script.name).read_text()
        assert (work / script.name).read_text() == expected, f"run `make examples` ({script.name})"
    assert sorted(p.name for p in REWRITTEN.glob("*.py")) == [p.name for p in NAIVE]


def test_rewriting_the_rewritten_examples_changes_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "autoopt", "rewrite", "--check", "--unsafe-fixes", str(REWRITTEN)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(REWRITTEN.glob("*.py")), ids=lambda p: p.stem)
def test_rewritten_script_still_trains(script: Path) -> None:
    losses = epoch_losses(run_script(script, "--epochs", "3", "--steps", "6"))
    assert len(losses) == 3
    assert losses[-1] < losses[0], losses
