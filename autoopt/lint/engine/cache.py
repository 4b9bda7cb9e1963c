"""The results cache: `.autoopt_cache/` at the project root, like Ruff's `.ruff_cache/`.

One JSON file per *settings key* (the selected rules with a hash of every .py file of their
folders and of the whole engine package,
the autoopt and libcst versions, the target torch version). Inside it, each file's entry
holds the hash of the content it was computed from, and the hashes of the project's other files
that its rules read (a local module that defines the model); an entry is used only when all of
them match, so editing a file, a module it imports, or any rule re-lints exactly what it must. JSON and not
pickle on purpose: a cache folder can come from anywhere (a checkout, an artifact) and loading it
must never run code. The cache is best effort: an unreadable or unwritable cache is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autoopt.lint.engine.results import FileResult
from autoopt.lint.tree.encoding import content_digest

CACHE_DIR_NAME = ".autoopt_cache"
_KEEP_KEYS = 8  # settings-key files kept per version (older ones are pruned)


def _unchanged(depends: dict[str, str]) -> bool:
    """Every other file a result was computed from still has the content it had then."""
    for dep, dep_digest in depends.items():
        try:
            if content_digest(Path(dep).read_bytes()) != dep_digest:
                return False
        except OSError:
            return False
    return True


def settings_key(fingerprint: str, target_version: tuple[int, int] | None) -> str:
    text = f"{fingerprint}|{target_version}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Cache:
    """Cached `FileResult`s of one settings key, loaded once and saved once per run."""

    def __init__(self, root: Path, key: str, version: str, enabled: bool = True) -> None:
        self.root = Path(root)
        self.folder = self.root / CACHE_DIR_NAME / version
        self.file = self.folder / f"{key}.json"
        self.enabled = enabled
        self.entries: dict[str, list[Any]] = {}
        self._dirty = False
        if enabled:
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.file.read_bytes())
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and isinstance(data.get("files"), dict):
            self.entries = data["files"]

    def entry_key(self, path: Path | str) -> str:
        absolute = os.path.abspath(path)
        try:
            rel = os.path.relpath(absolute, self.root)
        except ValueError:
            return absolute
        return absolute if rel.startswith("..") else rel.replace(os.sep, "/")

    def get(self, path: Path | str, digest: str, display: str) -> FileResult | None:
        """The cached result of `path` if it was computed from content with `digest`."""
        if not self.enabled:
            return None
        entry = self.entries.get(self.entry_key(path))
        if not entry or entry[0] != digest:
            return None
        try:
            result = FileResult.from_cache(display, entry)
        except (TypeError, ValueError):  # an entry of an older shape: ignore it
            return None
        return result if _unchanged(result.depends) else None

    def put(self, path: Path | str, result: FileResult) -> None:
        if not self.enabled or not result.digest:
            return
        self.entries[self.entry_key(path)] = result.to_cache()
        self._dirty = True

    def save(self) -> None:
        """Write the cache atomically (temp file + replace); failures are ignored."""
        if not self.enabled or not self._dirty:
            return
        try:
            self._prepare_folder()
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    json.dump({"files": self.entries}, handle, separators=(",", ":"))
                os.replace(tmp, self.file)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._prune()
        except OSError:
            return
        self._dirty = False

    def _prepare_folder(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        top = self.root / CACHE_DIR_NAME
        ignore = top / ".gitignore"
        if not ignore.exists():  # keep the cache out of git, as Ruff does
            ignore.write_text("# Automatically created by autoopt.\n*\n")
        tag = top / "CACHEDIR.TAG"
        if not tag.exists():  # and out of backups
            tag.write_text(
                "Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This file is a cache directory tag created by autoopt.\n"
            )

    def _prune(self) -> None:
        files = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in files[_KEEP_KEYS:]:
            with contextlib.suppress(OSError):
                stale.unlink()
