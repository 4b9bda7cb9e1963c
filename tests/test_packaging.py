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


@pytest.mark.slow
def test_wheel_contains_rules_and_imports_them(tmp_path: Path) -> None:
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "benchmarks"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("autoopt-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    rule_files = sorted(p.name for p in (ROOT / "rules").glob("*.py"))
    for name in rule_files:
        assert f"autoopt/rules/{name}" in names
    assert not any(n.startswith("rules/") for n in names), "rules/ must not ship as a top-level pkg"

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", "import autoopt.rules; print(autoopt.rules.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    ).stdout.strip()
    assert Path(out).is_relative_to(target)


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
