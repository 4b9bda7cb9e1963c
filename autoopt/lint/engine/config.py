"""`[tool.autoopt]` configuration, merged with command-line options (which win).

The config is the first `pyproject.toml` with a `[tool.autoopt]` table found walking up from the
linted paths (or the file given with `--config`). Keys are the command-line options plus
`exclude`, `per-file-ignores` and `extra-rules`; paths in it are relative to its folder:

    [tool.autoopt]
    select = ["ALL"]
    ignore = ["AO603"]
    extend-select = []
    target-version = "2.0"            # torch version the scripts target
    output-format = "text"            # text | json | sarif | github
    exit-zero = false
    unsafe-fixes = false              # rewrite: also apply fixes that may change behaviour
    force-exclude = false             # apply `exclude` to files named on the command line too
    exclude = ["legacy/", "*_old.py"] # gitignore-style, on top of the default excludes
    extend-exclude = ["vendored/"]    # more of the same (also --extend-exclude on the CLI)
    per-file-ignores = { "tests/*" = ["AO1"] }
    extra-rules = ["tools/autoopt_rules"]

An unknown key or a value of the wrong type is a `ConfigError` (exit code 2), with a suggestion.

`extra-rules` are Python modules of the project: importing them runs its code. They are loaded
only when the user opts in (`--allow-project-rules` or AUTOOPT_ALLOW_PROJECT_RULES=1), so that
linting an untrusted checkout never executes anything from it; otherwise `Settings` lists them
as skipped and the command line says so.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from autoopt.lint.engine.registry import Selection

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

OUTPUT_FORMATS = ("text", "json", "sarif", "github")
# Set to 1 to load the `extra-rules` a project's config names (they are that project's code).
ALLOW_PROJECT_RULES_ENV = "AUTOOPT_ALLOW_PROJECT_RULES"

_LIST_KEYS = ("select", "ignore", "extend-select", "exclude", "extend-exclude", "extra-rules")
_BOOL_KEYS = ("exit-zero", "unsafe-fixes", "force-exclude")
_STR_KEYS = ("target-version", "output-format")
KNOWN_KEYS = (*_LIST_KEYS, *_BOOL_KEYS, *_STR_KEYS, "per-file-ignores")


class ConfigError(Exception):
    """Invalid configuration or option value (exit code 2)."""


def parse_target_version(text: str, where: str = "--target-version") -> tuple[int, int]:
    """`"2.0"`, `"2"`, `"2.1.3"`, `"v2.1"` -> (major, minor)."""
    if not isinstance(text, str):
        raise ConfigError(f'{where}: expected a version string like "2.0", got {text!r}')
    try:
        version = Version(text.strip().lstrip("vV"))
    except InvalidVersion:
        raise ConfigError(
            f'{where}: {text!r} is not a torch version (expected e.g. "2.0" or "1.13")'
        ) from None
    return version.major, version.minor


@dataclass
class Options:
    """What the command line says. None (or empty for lists) means 'not given'."""

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    target_version: str | None = None
    output_format: str | None = None
    exit_zero: bool | None = None
    unsafe_fixes: bool | None = None
    force_exclude: bool | None = None
    extend_exclude: tuple[str, ...] = ()
    config: Path | None = None
    no_cache: bool = False
    # Load `extra-rules` named by the config (code from the linted project). None: the
    # AUTOOPT_ALLOW_PROJECT_RULES environment variable decides; unset means no.
    allow_project_rules: bool | None = None


@dataclass
class FileConfig:
    """The validated `[tool.autoopt]` table of one file."""

    path: Path | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    target_version: tuple[int, int] | None = None
    output_format: str | None = None
    exit_zero: bool | None = None
    unsafe_fixes: bool | None = None
    force_exclude: bool | None = None
    exclude: tuple[str, ...] = ()
    extend_exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extra_rules: tuple[Path, ...] = ()

    @property
    def folder(self) -> Path | None:
        return None if self.path is None else self.path.parent


@dataclass
class Settings:
    """Config and options merged: what a lint or rewrite run uses."""

    layers: list[Selection] = field(default_factory=list)
    target_version: tuple[int, int] | None = None
    output_format: str = "text"
    exit_zero: bool = False
    unsafe_fixes: bool = False
    force_exclude: bool = False
    exclude: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extra_rules: tuple[Path, ...] = ()  # loaded: the project's rules were allowed
    skipped_extra_rules: tuple[Path, ...] = ()  # configured but not loaded (not allowed)
    config_path: Path | None = None
    # Where excludes and per-file-ignores are relative to, and where .autoopt_cache lives.
    project_root: Path = field(default_factory=Path.cwd)
    use_cache: bool = True


# ----- reading ---------------------------------------------------------------------------------


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _table_of(path: Path, data: dict[str, Any], explicit: bool) -> dict[str, Any] | None:
    """The autoopt table of a parsed file: `[tool.autoopt]`, or (for an explicit non-pyproject
    file such as `autoopt.toml`) the top level."""
    tool = data.get("tool")
    if isinstance(tool, dict) and "autoopt" in tool:
        table = tool["autoopt"]
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [tool.autoopt] must be a table")
        return table
    if explicit and path.name != "pyproject.toml":
        return data
    return None


def _string_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):  # a lone string is a common slip: say how to write it
        raise ConfigError(
            f"{where}: `{key}` must be a list of strings, got the string {value!r} "
            f"(write {key} = [{value!r}])".replace("'", '"')
        )
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: `{key}` must be a list of strings, got {value!r}")
    return tuple(value)


def parse_table(table: dict[str, Any], path: Path | None) -> FileConfig:
    """Validate a `[tool.autoopt]` table into a `FileConfig`."""
    where = f"{path or '<config>'} [tool.autoopt]"
    folder = path.parent if path is not None else Path.cwd()
    config = FileConfig(path=path)
    for key, value in table.items():
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            known = ", ".join(KNOWN_KEYS)
            raise ConfigError(f"{where}: unknown key `{key}`{hint} (known keys: {known})")
        attr = key.replace("-", "_")
        if key in ("select", "ignore", "extend-select", "exclude"):
            setattr(config, attr, _string_list(value, key, where))
        elif key == "extend-exclude":
            config.extend_exclude = _string_list(value, key, where)
        elif key == "extra-rules":
            config.extra_rules = tuple(
                (folder / p).resolve() for p in _string_list(value, key, where)
            )
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: `{key}` must be true or false, got {value!r}")
            setattr(config, attr, value)
        elif key == "target-version":
            config.target_version = parse_target_version(value, f"{where}: `target-version`")
        elif key == "output-format":
            if value not in OUTPUT_FORMATS:
                raise ConfigError(
                    f"{where}: `output-format` must be one of {', '.join(OUTPUT_FORMATS)}, "
                    f"got {value!r}"
                )
            config.output_format = value
        elif key == "per-file-ignores":
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{where}: `per-file-ignores` must be a table of pattern = [codes]"
                )
            config.per_file_ignores = tuple(
                (pattern, _string_list(codes, f"per-file-ignores.{pattern!r}", where))
                for pattern, codes in value.items()
            )
    return config


def read_config(path: Path, explicit: bool = True) -> FileConfig:
    """Read the autoopt settings of `path` (empty settings if it has none)."""
    path = path.resolve()
    if explicit and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    table = _table_of(path, _load_toml(path), explicit)
    return parse_table(table or {}, path)


# ----- finding ---------------------------------------------------------------------------------


def common_start(paths: Sequence[Path | str]) -> Path:
    """The folder to search upward from: the common parent of `paths` (cwd if none)."""
    if not paths:
        return Path.cwd()
    resolved = [Path(os.path.abspath(p)) for p in paths]
    folders = [p if p.is_dir() else p.parent for p in resolved]
    try:
        return Path(os.path.commonpath([str(f) for f in folders]))
    except ValueError:  # different drives on Windows
        return folders[0]


def find_config(start: Path) -> Path | None:
    """The first `pyproject.toml` with a `[tool.autoopt]` table at or above `start`."""
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            data = _load_toml(candidate)
            if _table_of(candidate, data, explicit=False) is not None:
                return candidate
    return None


def find_project_root(start: Path) -> Path:
    """The nearest folder at or above `start` holding a pyproject.toml or .git (else cwd)."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return Path.cwd()


def resolve_settings(paths: Sequence[Path | str], options: Options | None = None) -> Settings:
    """Find and read the config for `paths`, then lay `options` over it."""
    options = options or Options()
    start = common_start(paths)
    if options.config is not None:
        config = read_config(Path(options.config), explicit=True)
    else:
        found = find_config(start)
        config = read_config(found, explicit=False) if found else FileConfig()
    root = config.folder or find_project_root(start)

    layers = [
        Selection(
            select=config.select,
            ignore=config.ignore,
            extend_select=config.extend_select,
            source=f"{config.path} [tool.autoopt]" if config.path else "config",
        ),
        Selection(
            select=options.select,
            ignore=options.ignore,
            extend_select=options.extend_select,
            source="the command-line options",
        ),
    ]
    target = config.target_version
    if options.target_version is not None:
        target = parse_target_version(options.target_version)
    output_format = options.output_format or config.output_format or "text"
    if output_format not in OUTPUT_FORMATS:
        raise ConfigError(f"unknown output format {output_format!r}")

    def pick(option: bool | None, configured: bool | None) -> bool:
        return bool(option if option is not None else configured)

    allowed = options.allow_project_rules
    if allowed is None:
        allowed = os.environ.get(ALLOW_PROJECT_RULES_ENV, "").lower() in ("1", "true", "yes")

    return Settings(
        layers=layers,
        target_version=target,
        output_format=output_format,
        exit_zero=pick(options.exit_zero, config.exit_zero),
        unsafe_fixes=pick(options.unsafe_fixes, config.unsafe_fixes),
        force_exclude=pick(options.force_exclude, config.force_exclude),
        exclude=config.exclude + config.extend_exclude + options.extend_exclude,
        per_file_ignores=config.per_file_ignores,
        extra_rules=config.extra_rules if allowed else (),
        skipped_extra_rules=() if allowed else config.extra_rules,
        config_path=config.path,
        project_root=root.resolve(),
        use_cache=not options.no_cache,
    )
