"""`autoopt rewrite`: in place, --diff, --check, --unsafe-fixes, --wrap, selection, bad files."""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli.rewrite import atomic_write, rewrite

TRAIN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Linear(4, 2).to(device)
    loader = DataLoader(ds, batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    """
).lstrip()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(rewrite, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_unsafe_amp_fix_is_only_offered_without_the_flag(project: Path) -> None:
    code, out, err = run("train.py", "--select", "AO201")
    assert code == 0
    assert (project / "train.py").read_text() == TRAIN
    assert "1 unsafe fix available with --unsafe-fixes (AO201 ×1)" in err


def test_rewrites_in_place_keeping_permissions(project: Path) -> None:
    target = project / "train.py"
    os.chmod(target, 0o750)
    code, out, err = run("train.py", "--select", "AO201", "--unsafe-fixes")
    assert code == 0, err
    text = target.read_text()
    assert (
        'with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):'
        in text
    )
    assert "scaler.step(optimizer)" in text
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert "Rewrote 1 file (1 fixes: AO201 ×1)." in err
    assert not [p for p in project.iterdir() if p.name.endswith(".tmp")]
    # idempotent: a second run changes nothing
    code, _, err = run("train.py", "--select", "AO201", "--unsafe-fixes", "--check")
    assert code == 0 and "Would rewrite 0 files." in err


def test_diff_and_check_write_nothing(project: Path) -> None:
    code, out, err = run("--diff", "--select", "AO201", "--unsafe-fixes")
    assert code == 1  # Ruff's convention: --diff exits 1 when it would change something
    assert out.startswith("--- a/train.py\n+++ b/train.py\n")
    assert "\n-    loss.backward()\n" in out and "\n+    scaler.scale(loss).backward()\n" in out
    assert (project / "train.py").read_text() == TRAIN
    code, out, err = run("--check", "--select", "AO201", "--unsafe-fixes")
    assert code == 1 and out == ""
    assert "Would rewrite 1 file" in err
    assert (project / "train.py").read_text() == TRAIN


def test_ignore_and_noqa_are_honoured(project: Path) -> None:
    code, out, _ = run("--ignore", "AO201", "--unsafe-fixes", "--diff")
    assert code == (1 if out else 0) and "autocast" not in out
    suppressed = TRAIN.replace("for x, y in loader:", "for x, y in loader:  # noqa: AO201")
    (project / "train.py").write_text(suppressed)
    code, _, _ = run("--select", "AO201", "--unsafe-fixes")
    assert code == 0 and (project / "train.py").read_text() == suppressed


def test_config_enables_unsafe_fixes(project: Path) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.autoopt]\nunsafe-fixes = true\nselect = ["AO201"]\n'
    )
    code, _, err = run()
    assert code == 0, err
    assert "GradScaler" in (project / "train.py").read_text()


def test_unparsable_file_is_reported_and_others_still_rewritten(project: Path) -> None:
    (project / "broken.py").write_text("def (:\n")
    (project / "latin.py").write_bytes(b"x = '\xe9'\n")
    code, _, err = run(".", "--select", "AO201", "--unsafe-fixes")
    assert code == 2
    # Said as `autoopt lint` says it: path, line and column of the problem.
    assert "broken.py:1:5: error: syntax error: invalid syntax" in err
    assert "latin.py:1:6: error: cannot decode as utf-8: invalid byte 0xe9" in err
    assert (project / "broken.py").read_text() == "def (:\n"
    assert "GradScaler" in (project / "train.py").read_text()


def test_declined_fix_is_reported_with_its_reason(project: Path) -> None:
    (project / "train.py").write_text(
        "import torch\nfor x in loader:\n    loss = (w * x.cuda()).sum()\n    loss.backward()\n"
    )
    code, _, err = run("--select", "AO201", "--unsafe-fixes")
    assert code == 0
    assert "declined: train.py:2:1: AO201" in err and "no optimizer step()" in err


def test_wrap_inserts_optimize_and_declines_elsewhere(project: Path) -> None:
    (project / "hogwild.py").write_text(
        "import torch\nmodel.share_memory()\nopt = torch.optim.Adam(model.parameters())\n"
        "for x in loader:\n    model(x).sum().backward()\n    opt.step()\n"
        "mp.Process(target=train).start()\n"
    )
    (project / "notes.py").write_text("import torch\nx = torch.ones(1)\n")
    code, _, err = run("--wrap")
    assert code == 0, err
    text = (project / "train.py").read_text()
    assert (
        "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, device=device)\n"
        in text
    )
    assert "import autoopt\n" in text
    assert "declined: hogwild.py: --wrap declined: Hogwild training" in err
    assert "(wrapped 1, declined 2 (Hogwild ×1, no training loop ×1))" in err
    code, _, err = run("--wrap", "--check")
    assert code == 0
    assert "wrapped 0, 1 already call autoopt.optimize(), declined 2" in err


def test_unknown_selector_is_a_usage_error(project: Path) -> None:
    code, _, err = run("--select", "AO999")
    assert code == 2 and "AO999" in err


def test_atomic_write_replaces_symlink_target(tmp_path: Path) -> None:
    real = tmp_path / "real.py"
    real.write_text("old\n")
    os.chmod(real, 0o640)
    link = tmp_path / "link.py"
    link.symlink_to(real)
    atomic_write(link, b"new\n")
    assert link.is_symlink()
    assert real.read_text() == "new\n"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
