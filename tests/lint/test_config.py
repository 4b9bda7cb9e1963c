"""[tool.autoopt] discovery, validation, and merging with command-line options."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.lint.engine.config import (
    ConfigError,
    Options,
    find_config,
    parse_target_version,
    read_config,
    resolve_settings,
)
from autoopt.lint.engine.registry import resolve_selection


def _pyproject(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyproject.toml"
    path.write_text(body)
    return path


def test_config_found_upward_skipping_pyprojects_without_the_table(tmp_path: Path) -> None:
    top = _pyproject(tmp_path, '[tool.autoopt]\nselect = ["AO2"]\n')
    _pyproject(tmp_path / "sub", '[project]\nname = "x"\n')
    (tmp_path / "sub" / "deep").mkdir()
    assert find_config(tmp_path / "sub" / "deep") == top
    settings = resolve_settings([tmp_path / "sub" / "deep"])
    assert settings.config_path == top and settings.project_root == tmp_path
    assert settings.layers[0].select == ("AO2",)


def test_all_keys_parse(tmp_path: Path) -> None:
    path = _pyproject(
        tmp_path,
        """[tool.autoopt]
select = ["AO1", "AO2"]
ignore = ["AO201"]
extend-select = ["AO3"]
target-version = "1.13"
output-format = "json"
exit-zero = true
unsafe-fixes = true
force-exclude = true
exclude = ["legacy/"]
per-file-ignores = { "tests/*" = ["AO1"] }
extra-rules = ["my_rules"]
""",
    )
    config = read_config(path)
    assert config.target_version == (1, 13)
    assert config.extra_rules == ((tmp_path / "my_rules").resolve(),)
    assert config.per_file_ignores == (("tests/*", ("AO1",)),)
    assert config.exit_zero and config.unsafe_fixes and config.force_exclude
    assert config.output_format == "json" and config.exclude == ("legacy/",)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("selectt = []", "unknown key `selectt`; did you mean `select`?"),
        ("ignore = [1]", "`ignore` must be a list of strings"),
        ('select = "AO1"', 'got the string "AO1" (write select = ["AO1"])'),
        ('extend-exclude = "x"', "`extend-exclude` must be a list of strings"),
        ("exit-zero = 1", "`exit-zero` must be true or false"),
        ("target-version = 2.0", 'expected a version string like "2.0"'),
        ('target-version = "two"', "is not a torch version"),
        ('output-format = "xml"', "`output-format` must be one of"),
        ('per-file-ignores = ["x"]', "must be a table"),
        ("select = [", "invalid TOML"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, body: str, words: str) -> None:
    _pyproject(tmp_path, f"[tool.autoopt]\n{body}\n")
    with pytest.raises(ConfigError) as info:
        resolve_settings([tmp_path])
    assert words in str(info.value)
    assert "pyproject.toml" in str(info.value)


def test_cli_options_override_config(tmp_path: Path) -> None:
    _pyproject(
        tmp_path,
        '[tool.autoopt]\nselect = ["AO1"]\ntarget-version = "1.13"\noutput-format = "json"\n'
        "exit-zero = true\n",
    )
    settings = resolve_settings(
        [tmp_path],
        Options(select=("AO2",), target_version="2.1", output_format="sarif", exit_zero=False),
    )
    assert settings.target_version == (2, 1)
    assert settings.output_format == "sarif" and settings.exit_zero is False
    codes = ["AO101", "AO201"]
    assert resolve_selection(codes, settings.layers) == {"AO201"}


def test_explicit_config_file(tmp_path: Path) -> None:
    other = tmp_path / "autoopt.toml"
    other.write_text('ignore = ["AO1"]\n')
    settings = resolve_settings([tmp_path], Options(config=other))
    assert settings.layers[0].ignore == ("AO1",)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_settings([tmp_path], Options(config=tmp_path / "missing.toml"))


def test_no_config_uses_git_root_or_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    settings = resolve_settings([tmp_path / "repo" / "src"])
    assert settings.config_path is None and settings.project_root == tmp_path / "repo"


@pytest.mark.parametrize(
    ("text", "expected"), [("2.0", (2, 0)), ("2", (2, 0)), ("2.1.3", (2, 1)), ("v1.13", (1, 13))]
)
def test_parse_target_version(text: str, expected: tuple[int, int]) -> None:
    assert parse_target_version(text) == expected
