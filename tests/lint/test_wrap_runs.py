"""Wrapped fixture scripts still train: run each original and its `--wrap` version (with the
inserted calls held to fp32 eager: amp=False, compile=False) and compare every printed loss."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autoopt.lint.wrap.insert import wrap_source
from tests.lint.test_wrap_fixtures import parallel_edit

FIXTURES = Path(__file__).parent / "fixtures" / "wrap"


def fp32(line: str) -> str:
    """The inserted call held to fp32 eager on the CPU: amp=False, compile=False, and
    device='cpu' unless the script's own device is already passed."""
    call = line.split("  # autoopt:")[0].removesuffix(")")
    for option in (', amp="script"', ", amp=False", ", compile=False"):
        call = call.replace(option, "")
    device = "" if ", device=" in call else ", device='cpu'"
    return call + f", amp=False, compile=False{device}, verbose=False)"


pytestmark = pytest.mark.slow


def run(script: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, script.name],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    losses = [line for line in done.stdout.splitlines() if "loss" in line or line.startswith("g ")]
    assert losses, done.stdout
    return losses


def wrap_fp32(script: Path) -> None:
    """`--wrap` `script` in place, the inserted calls held to fp32 eager on the CPU."""
    result = wrap_source(script.read_text(), path=script)
    assert result.inserted and not result.declined, result.message
    text = result.source
    for line in result.inserted:
        text = text.replace(line, fp32(line))
    script.write_text(text)


@pytest.mark.parametrize(
    "name",
    [
        "main_train_split.py",
        "gan.py",
        "get_batch.py",
        "helper_module/train.py",
        "trainer_class.py",
        "mnist_device.py",
        "config_device.py",
        "args_device.py",
        "iter_next.py",
        "shared_optimizer.py",
        "step_progress_bar.py",
        "cpu_only.py",
        "nested_backward.py",
        "factory_gpu_flag/train.py",
        "step_helper.py",
        "lbfgs_closure.py",
        "global_loader_attack.py",
        "held_loader.py",
        "sac_temperature.py",
        "optional_second_model.py",
        "placed_after_optimizer.py",
        "run_per_seed.py",
        "module_list_holder.py",
        "ema_weights.py",
        "factory_keeps_models.py",
    ],
)
def test_wrapped_script_trains_with_the_same_fp32_losses(name: str, tmp_path: Path) -> None:
    source = FIXTURES / name
    for sibling in source.parent.glob("*.py"):  # local modules the script imports
        shutil.copy(sibling, tmp_path / sibling.name)
    script = tmp_path / source.name
    before = run(script)

    wrap_fp32(script)
    after = run(script)

    assert after == before


def test_the_edit_a_parallel_wrap_decline_names_trains_the_same(tmp_path: Path) -> None:
    """The DataParallel decline's edit (the optimizer above the wrap), then --wrap: the script
    trains as the original did (DataParallel on the CPU runs the module itself)."""
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / "dataparallel_first.py").read_text())
    before = run(script)
    script.write_text(parallel_edit(script.read_text()))
    wrap_fp32(script)
    assert "DataParallel" in script.read_text()
    assert run(script) == before
