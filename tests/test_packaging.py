"""The top-level rules/ folder ships as `autoopt.rules`, in the wheel and in the editable install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_editable_install_maps_rules_folder() -> None:
    import autoopt.rules

    assert Path(autoopt.rules.__file__).resolve() == ROOT / "rules" / "__init__.py"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel a user would install, built from a copy of the checkout (an in-tree build would
    leave build/ and *.egg-info behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "benchmarks"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = tmp.glob("autoopt-*.whl")
    return built


def _source_modules() -> set[str]:
    """Every module of the source tree, as the path it must have inside the wheel."""
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autoopt").rglob("*.py")}
    modules |= {
        f"autoopt/rules/{p.relative_to(ROOT / 'rules').as_posix()}"
        for p in (ROOT / "rules").rglob("*.py")
    }
    return {m for m in modules if "__pycache__" not in m}


@pytest.mark.slow
def test_wheel_contains_every_module(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_source_modules() - names)
    assert not missing, f"modules missing from the wheel: {missing}"
    assert not any(n.startswith(("rules/", "tests/", "benchmarks/")) for n in names)


@pytest.mark.slow
def test_wheel_works_in_a_fresh_environment(wheel: Path, tmp_path: Path) -> None:
    """What `pip install autoopt` gives a user: a new virtual environment outside the checkout,
    the wheel and its declared dependencies (torch pinned to the local CPU build), then the CLI,
    a lint with a finding, and optimize() with tune=True, all run from outside the checkout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    constraints = ROOT / "constraints-cpu.txt"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    work = tmp_path / "user"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AUTOOPT_CACHE_DIR"] = str(tmp_path / "cache")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, cwd=work, env=env)

    version = run(str(venv / "bin" / "autoopt"), "--version")
    assert version.returncode == 0, version.stderr
    assert "0.1.0" in version.stdout

    script = work / "train.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(list(range(8)), batch_size=2)\n"
    )
    lint = run(str(venv / "bin" / "autoopt"), "lint", "--select", "AO101", "train.py")
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "AO101" in lint.stdout

    program = (
        "import torch, autoopt, pathlib\n"
        f"assert pathlib.Path(autoopt.__file__).is_relative_to(pathlib.Path({str(venv)!r}))\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), "
        "torch.nn.Linear(16, 2))\n"
        "data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))\n"
        "loader = torch.utils.data.DataLoader(data, batch_size=8)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, loader, optimizer = autoopt.optimize(model, loader, optimizer, tune=True, "
        "verbose=False)\n"
        "for x, y in loader:\n"
        "    optimizer.zero_grad()\n"
        "    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "print('trained', float(loss))\n"
    )
    trained = run(str(python), "-c", program)
    assert trained.returncode == 0, trained.stdout + trained.stderr[-3000:]
    assert "trained" in trained.stdout


def test_lint_cli_does_not_import_torch() -> None:
    # lint/rewrite must start fast: torch is only imported by the runtime, on first use.
    code = "import sys, autoopt, autoopt.cli; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_public_api_resolves_lazily() -> None:
    import autoopt
    from autoopt.runtime.optimize import optimize

    assert autoopt.optimize is optimize
    with pytest.raises(AttributeError):
        autoopt.no_such_name  # noqa: B018


def test_version_and_help_import_neither_libcst_nor_torch() -> None:
    # `autoopt --version`/`--help` start in a fraction of a second: subcommands load on use.
    code = (
        "import sys\n"
        "from autoopt.cli import main\n"
        "for args in (['--version'], ['--help']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "heavy = [m for m in ('libcst', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_every_listed_subcommand_loads() -> None:
    from click.testing import CliRunner

    from autoopt.cli import SUBCOMMANDS, main

    for name in SUBCOMMANDS:
        result = CliRunner().invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"Usage: main {name}" in result.output or f" {name} " in result.output


def test_dir_shows_the_public_api() -> None:
    import autoopt

    assert dir(autoopt) == sorted(autoopt.__all__)
