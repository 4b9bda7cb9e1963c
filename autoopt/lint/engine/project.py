"""A run's plan: merged settings, the selected rules, the files, and per-file rule filtering.

Shared by `autoopt lint` and `autoopt rewrite`, so both honour the same config, selection,
excludes and per-file-ignores:

    project = load_project(paths, Options(select=..., ignore=...))
    for path in project.files:
        rules = project.rules_for(path)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from autoopt.lint.engine.config import Options, Settings, resolve_settings
from autoopt.lint.engine.discovery import Discovered, discover, follow_training
from autoopt.lint.engine.registry import (
    Registry,
    check_selectors,
    load_registry,
    normalize_selector,
)
from autoopt.lint.engine.rule import Rule
from autoopt.lint.engine.suppress import matches
from autoopt.lint.program import project_files


@dataclass
class PerFileIgnores:
    """`per-file-ignores`: gitignore-style patterns (relative to the project root) -> codes."""

    root: Path
    entries: list[tuple[pathspec.PathSpec, frozenset[str]]] = field(default_factory=list)

    @classmethod
    def build(
        cls, root: Path, table: Sequence[tuple[str, Sequence[str]]], codes: Sequence[str]
    ) -> PerFileIgnores:
        out = cls(Path(os.path.abspath(root)))
        for pattern, selectors in table:
            check_selectors(selectors, codes, f"per-file-ignores[{pattern!r}]")
            spec = pathspec.GitIgnoreSpec.from_lines([pattern])
            out.entries.append((spec, frozenset(normalize_selector(s) for s in selectors)))
        return out

    def ignored(self, path: Path | str) -> frozenset[str]:
        """Selectors ignored for `path` (empty when no pattern matches)."""
        if not self.entries:
            return frozenset()
        absolute = os.path.abspath(path)
        rel = os.path.relpath(absolute, self.root).replace(os.sep, "/")
        if rel.startswith(".."):
            rel = absolute.replace(os.sep, "/").lstrip("/")
        found: set[str] = set()
        for spec, selectors in self.entries:
            if spec.match_file(rel):
                found |= selectors
        return frozenset(found)

    def allows(self, code: str, ignored: frozenset[str]) -> bool:
        return not ignored or not matches(
            code, frozenset("*" if s == "ALL" else s for s in ignored)
        )


@dataclass
class Project:
    """Everything decided before any file is read."""

    settings: Settings
    registry: Registry
    rules: list[type[Rule]]  # selected, sorted by code
    discovered: Discovered
    per_file_ignores: PerFileIgnores

    @property
    def files(self) -> list[Path]:
        return self.discovered.files

    @property
    def checked_files(self) -> list[Path]:
        """What the lint reads: the files discovered, then the modules followed from them."""
        return [*self.discovered.files, *(module for module, _ in self.discovered.followed)]

    def reports(self, path: Path | str, code: str, line: int | None = None) -> bool:
        """A finding of rule `code` in `path` (at `line`) is reported: the per-file-ignores
        allow it, and a module checked only because it defines a trained model reports the
        model rules (and AO608 in the code their forwards run), one checked because it builds
        the optimizer the optimizer's rules, a loader module the loader rules in the
        functions that build the training's loaders, and a step helper's module (a function
        the training step runs on the model) the step rules."""
        from autoopt.lint.program.followed import (
            EVALUATION_RULES,
            FORWARD_RULES,
            LOADER_RULES,
            MODEL_RULES,
            OPTIMIZER_RULES,
            OPTIONS_RULES,
            STEP_RULES,
        )

        if Path(path) in self.discovered.model_definers and code not in MODEL_RULES:
            forward = self.discovered.forward_lines.get(Path(path), [])
            if code not in FORWARD_RULES or not _within(line, forward):
                return False
        if Path(path) in self.discovered.optimizer_builders and code not in OPTIMIZER_RULES:
            return False
        if Path(path) in self.discovered.loader_option_builders and code not in LOADER_RULES:
            return False
        if Path(path) in self.discovered.evaluators and code not in EVALUATION_RULES:
            return False
        if Path(path) in self.discovered.option_parsers and code not in OPTIONS_RULES:
            return False
        if Path(path) in self.discovered.step_helpers and code not in STEP_RULES:
            return False
        spans = self.discovered.loader_lines.get(Path(path))
        if spans is not None and code in LOADER_RULES and not _within(line, spans):
            return False  # a loader its training never builds (`load_textset`)
        return self.per_file_ignores.allows(code, self.per_file_ignores.ignored(path))

    def rules_for(self, path: Path | str) -> list[type[Rule]]:
        """The selected rules minus the per-file-ignores that match `path`."""
        ignored = self.per_file_ignores.ignored(path)
        return [r for r in self.rules if self.per_file_ignores.allows(r.code, ignored)]


def _within(line: int | None, spans: list[tuple[int, int]]) -> bool:
    """`line` is inside one of `spans` (an unknown line is: nothing to tell it apart by)."""
    return line is None or any(first <= line <= last for first, last in spans)


def registry_for(settings: Settings) -> Registry:
    """Built-in rules plus the config's `extra-rules` folders."""
    return load_registry(settings.extra_rules)


def load_project(
    paths: Sequence[Path | str],
    options: Options | None = None,
    registry: Registry | None = None,
    *,
    config_from: Sequence[Path | str] | None = None,
    follow: bool = False,
) -> Project:
    """Resolve config + options, load and select rules, and discover the files under `paths`.
    The config is the one that applies to `config_from` (default: `paths`; standard input has no
    files to discover but a name to find its config by). `follow`: also the modules holding the
    training that the files named run (`discovery.follow_training`; the lint's default).
    Raises `ConfigError` or `RuleError` (both: exit code 2)."""
    project_files.begin_run()  # a new run sees the project's files as they are now
    paths = list(paths) if config_from is not None else list(paths) or ["."]
    settings = resolve_settings(list(config_from) if config_from else paths, options)
    registry = registry if registry is not None else registry_for(settings)
    rules = registry.select(settings.layers)
    codes = list(registry.rules)
    per_file = PerFileIgnores.build(settings.project_root, settings.per_file_ignores, codes)
    discovered = (
        discover(paths, settings.project_root, settings.exclude, settings.force_exclude)
        if paths
        else Discovered()
    )
    if follow and paths:
        follow_training(discovered, paths, settings.project_root, settings.exclude)
    return Project(settings, registry, rules, discovered, per_file)
