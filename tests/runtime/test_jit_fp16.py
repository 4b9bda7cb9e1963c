"""jit + fp16 against torch by hand, in a fresh process.

In one process, TorchScript fails a backward ("Half != BFloat16") once a class was scripted under
bf16 autocast earlier (with or without autoopt), so test_equivalence cannot run this case after
its jit + bf16 ones. A fresh interpreter has scripted nothing yet: there the case runs in full."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from tests.runtime.test_equivalence import PATTERNS, compare
compare(PATTERNS[{pattern!r}], amp="fp16", accumulate=2, compile="jit", channels_last=False,
        checkpoint=False, rtol=1e-3, atol=1e-4)
print("same training")
"""


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["plain mlp", "dict outputs"])
def test_jit_fp16_trains_like_torch_by_hand_in_a_fresh_process(pattern: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(pattern=pattern)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0 and "same training" in proc.stdout, proc.stderr[-3000:]
