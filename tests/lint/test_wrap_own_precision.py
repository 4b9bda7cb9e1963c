"""A script that runs its own precision, wrapped: the call gets amp="script" (autoopt adds no
autocast and no loss scaling; compile, the layout and the optimizer step are chosen as usual),
and the wrapped script, run as written, still trains as the original does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autoopt.lint.wrap.insert import wrap_source

FIXTURES = Path(__file__).parent / "fixtures" / "wrap"
ROOT = Path(__file__).resolve().parents[2]


def run(script: Path) -> tuple[list[float], str]:
    """The losses the script prints, and its stderr (the optimize() report)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env["AUTOOPT_COMPILE_CACHE"] = str(script.parent / "compile-cache")  # empty: a first run
    done = subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = [
        float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("loss")
    ]
    assert losses, done.stdout
    return losses, done.stderr


def test_a_script_with_its_own_bf16_autocast_is_wrapped_with_amp_script_and_trains(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "own_bf16_autocast.py").read_text())
    before, _ = run(script)

    result = wrap_source(script.read_text(), path=script)
    assert result.inserted and not result.declined, result.message
    (call,) = result.inserted
    assert 'amp="script")  # autoopt: amp="script" (own autocast/GradScaler)' in call
    script.write_text(result.source)
    after, log = run(script)

    assert "amp='script'" in log, log  # the report's amp line: precision left to the script
    assert "autocast was already active" not in log  # nothing of autoopt's to stand down
    # The script's bf16 autocast as written, the same dropout masks (plain SGD: its fused,
    # foreach and default steps update alike): the printed losses are the original's.
    assert after == before
