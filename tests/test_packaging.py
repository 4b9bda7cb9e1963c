"""The top-level rules/ folder ships as `autoopt.rules`, in the wheel and in the editable install."""

from __future__ import annotations

import json
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


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# What the wheel may add to an environment: a lint-only CI job or the pre-commit hook installs
# it, and Ruff's hook is a 10 MB binary (issue 32 asks for a hook environment under 50 MB).
LINT_INSTALL_MB = 50


@pytest.mark.slow
def test_wheel_works_in_a_fresh_environment(wheel: Path, tmp_path: Path) -> None:
    """What `pip install autoopt` gives a user, in a new virtual environment outside the
    checkout (an editable install would hide a file missing from the wheel): first without
    torch, as a lint-only CI job or the pre-commit hook has it (no torch is installed, lint and
    rewrite run, the runtime says what to install); then with `autoopt[torch]` (torch pinned to
    the local CPU build): `bench --list` and one workload of the suite, and optimize(tune=True)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python, autoopt = venv / "bin" / "python", str(venv / "bin" / "autoopt")
    (site,) = (venv / "lib").glob("python*/site-packages")
    empty = _size(site)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)], capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr[-3000:]
    added_mb = (_size(site) - empty) / 2**20
    assert added_mb < LINT_INSTALL_MB, f"the lint's install adds {added_mb:.1f} MB"
    work = tmp_path / "user"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["AUTOOPT_CACHE_DIR"] = str(tmp_path / "cache")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, cwd=work, env=env)

    no_torch = run(str(python), "-c", "import importlib.util as u; print(u.find_spec('torch'))")
    assert no_torch.stdout.strip() == "None", "installing autoopt installed torch"
    version = run(autoopt, "--version")
    assert version.returncode == 0 and version.stdout == "autoopt 0.1.0\n", version

    script = work / "train.py"
    script.write_text((ROOT / "examples" / "naive" / "cnn_train.py").read_text())
    lint = run(autoopt, "lint", "--select", "AO102", "train.py")
    assert lint.returncode == 1, lint.stdout + lint.stderr
    assert "AO102" in lint.stdout
    for wrap in ((), ("--wrap",)):
        diff = run(autoopt, "rewrite", *wrap, "--diff", "train.py")
        assert diff.returncode == 1 and diff.stdout.startswith("--- a/train.py"), diff.stderr
    runtime = run(str(python), "-c", "import autoopt; autoopt.optimize")
    assert runtime.returncode == 1
    assert "autoopt.optimize needs PyTorch" in runtime.stderr and "Traceback" in runtime.stderr
    doctor = run(autoopt, "doctor")
    assert doctor.returncode == 2 and "autoopt doctor needs PyTorch" in doctor.stderr, doctor
    assert "Traceback" not in doctor.stderr

    constraints = ROOT / "constraints-cpu.txt"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-c", str(constraints), f"{wheel}[torch]"],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    listed = run(autoopt, "bench", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("cnn ") and "accelerate is not installed" in listed.stdout
    out = work / "bench.json"
    args = ["--workload", "mlp", "--config", "autoopt", "--config", "accelerate-bf16"]
    steps = ["--steps", "1", "--repeats", "1", "--warmup", "1", "--json", str(out)]
    bench = run(autoopt, "bench", *args, *steps)
    assert bench.returncode == 0, bench.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out.read_text())["workloads"][0]["configs"]}
    assert rows["eager"]["status"] == rows["autoopt"]["status"] == "ok", rows
    assert rows["accelerate-bf16"]["status"] == "skipped"
    assert "accelerate is not installed" in rows["accelerate-bf16"]["reason"]

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


def test_the_runtime_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where torch cannot be imported, the first use of the runtime names what is missing and
    how to install it; lint and rewrite do not need it (the wheel test above runs them)."""
    import importlib.util

    import autoopt
    from autoopt.torch_missing import missing

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name)
    )
    assert 'pip install "autoopt[torch]"' in (missing("autoopt doctor") or "")
    code = (
        "import sys; sys.modules['torch'] = None\n"  # what an environment without torch has
        "import autoopt\n"
        "try:\n"
        "    autoopt.seed_everything\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, exc)\n"
    )
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert said.stdout.startswith("torch autoopt.seed_everything needs PyTorch"), said
    assert autoopt.__version__


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
