"""Which files get linted: suffixes, default and configured excludes, symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoopt.lint.engine.discovery import discover


def _touch(root: Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n")


def _names(root: Path, found: list[Path]) -> list[str]:
    return sorted(Path(os.path.relpath(p, root)).as_posix() for p in found)


def test_recurses_and_skips_default_excludes(tmp_path: Path) -> None:
    _touch(
        tmp_path,
        "a.py",
        "nb.ipynb",
        "notes.txt",
        "pkg/b.py",
        ".venv/lib/c.py",
        "venv/d.py",
        "build/e.py",
        "pkg/__pycache__/f.py",
        ".git/g.py",
        "lib/site-packages/h.py",
        ".autoopt_cache/i.py",
    )
    found = discover([tmp_path], tmp_path).files
    assert _names(tmp_path, found) == ["a.py", "nb.ipynb", "pkg/b.py"]


def test_configured_excludes_are_gitignore_style(tmp_path: Path) -> None:
    _touch(tmp_path, "keep.py", "legacy/old.py", "src/x_old.py", "src/legacy/deep.py", "src/y.py")
    found = discover([tmp_path], tmp_path, exclude=["/legacy/", "*_old.py"]).files
    # "/legacy/" is anchored at the root: src/legacy stays
    assert _names(tmp_path, found) == ["keep.py", "src/legacy/deep.py", "src/y.py"]


def test_explicit_files_bypass_excludes_unless_forced(tmp_path: Path) -> None:
    _touch(tmp_path, "legacy/old.py")
    target = tmp_path / "legacy" / "old.py"
    assert discover([target], tmp_path, exclude=["legacy/"]).files == [target]
    assert discover([target], tmp_path, exclude=["legacy/"], force_exclude=True).files == []


def test_missing_path_is_an_error(tmp_path: Path) -> None:
    result = discover([tmp_path / "nope.py"], tmp_path)
    assert result.files == [] and "no such file" in result.errors[0][1].reason


def test_symlink_loops_are_safe(tmp_path: Path) -> None:
    _touch(tmp_path, "pkg/a.py")
    os.symlink(tmp_path / "pkg", tmp_path / "pkg" / "again")  # a folder linking to itself
    os.symlink(tmp_path / "loop.py", tmp_path / "loop.py")  # a file linking to itself
    os.symlink(tmp_path / "gone.py", tmp_path / "dangling.py")
    result = discover([tmp_path], tmp_path)
    assert _names(tmp_path, result.files) == ["pkg/a.py"]
    reasons = {Path(p).name: e.reason for p, e in result.errors}
    assert "symbolic link loop" in reasons["loop.py"]
    assert "broken symbolic link" in reasons["dangling.py"]


def test_order_is_stable(tmp_path: Path) -> None:
    _touch(tmp_path, "b.py", "a.py", "c/z.py", "c/a.py")
    assert _names(tmp_path, discover([tmp_path], tmp_path).files) == [
        "a.py",
        "b.py",
        "c/a.py",
        "c/z.py",
    ]


def test_unlistable_folder_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing `locked/` fails as a chmod 000 folder does for a non-root user (a monkeypatch,
    not chmod: CI runs as root, which chmod does not stop)."""
    _touch(tmp_path, "locked/a.py", "ok.py")
    scandir = os.scandir

    def deny(path: object) -> object:
        if Path(path).name == "locked":  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", deny)
    result = discover([tmp_path], tmp_path)
    assert _names(tmp_path, result.files) == ["ok.py"]
    assert result.errors[0][1].reason == "cannot list folder: Permission denied"
