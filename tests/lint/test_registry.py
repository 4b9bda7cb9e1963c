"""Loading rules (built-in package and extra-rules folders) and Ruff-style selection."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.lint.engine import registry as registry_module
from autoopt.lint.engine.registry import RuleError, Selection, load_registry, resolve_selection

from .fixtures import FIXTURE_RULES, load_fixture_rules

CODES = ["AO101", "AO102", "AO201", "AO202", "AO301", "XT101"]

GOOD_RULE = '''
from autoopt.lint.engine.rule import Rule

class R(Rule):
    """Docs."""
    code = "{code}"
    name = "r"
    message = "m"
'''


def _folder(tmp_path: Path, files: dict[str, str]) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_fixture_rules_load_sorted() -> None:
    registry = load_fixture_rules()
    assert list(registry.rules) == ["XT101", "XT201", "XT301"]
    assert registry.origins["XT101"] == FIXTURE_RULES / "cuda_call.py"


def test_builtin_rules_load_with_unique_codes() -> None:
    registry = load_registry()
    assert all(code.startswith("AO") for code in registry.rules)


@pytest.mark.parametrize(
    ("files", "words"),
    [
        ({"a.py": GOOD_RULE.format(code="XY1"), "b.py": GOOD_RULE.format(code="XY1")}, "duplicate"),
        ({"a.py": "x = 1\n"}, "defines no Rule"),
        (
            {
                "a.py": GOOD_RULE.format(code="XY1")
                + GOOD_RULE.replace("class R", "class S").format(code="XY2")
            },
            "one rule per file",
        ),
        ({"a.py": GOOD_RULE.format(code="lower1")}, "letters then digits"),
        ({"a.py": "import does_not_exist_anywhere\n"}, "ModuleNotFoundError"),
        ({"a.py": "def f(:\n"}, "SyntaxError"),
        (
            {"a.py": GOOD_RULE.format(code="XY1").replace('message = "m"', 'message = ""')},
            "`message`",
        ),
        (
            {
                "a.py": GOOD_RULE.format(code="XY1")
                + '    INVALID = [__import__("autoopt.lint.engine.rule").lint.engine.rule.Invalid("x\\n", line=5)]\n'
            },
            "line 5",
        ),
    ],
    ids=[
        "duplicate",
        "empty",
        "two-rules",
        "bad-code",
        "import-error",
        "syntax",
        "no-message",
        "bad-line",
    ],
)
def test_malformed_rules_are_clear_errors(
    tmp_path: Path, files: dict[str, str], words: str
) -> None:
    folder = _folder(tmp_path, files)
    with pytest.raises(RuleError, match=words) as info:
        load_registry([folder], include_builtin=False)
    assert "a.py" in str(info.value) or "b.py" in str(info.value)


def test_private_modules_and_base_classes_are_skipped(tmp_path: Path) -> None:
    base = "from autoopt.lint.engine.rule import Rule\n\nclass Base(Rule):\n    name = 'b'\n"
    rule = base + "\nclass R(Base):\n    code = 'XY7'\n    message = 'm'\n"
    folder = _folder(
        tmp_path, {"_helpers.py": "raise RuntimeError('never imported')\n", "r.py": rule}
    )
    assert list(load_registry([folder], include_builtin=False).rules) == ["XY7"]


def test_missing_extra_rules_folder(tmp_path: Path) -> None:
    with pytest.raises(RuleError, match="does not exist"):
        load_registry([tmp_path / "nope"], include_builtin=False)


def test_builtin_package_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "BUILTIN_PACKAGE", None)
    assert load_registry().rules == {}


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        ([], CODES),
        ([Selection(select=("AO2",))], ["AO201", "AO202"]),
        ([Selection(select=("ALL",), ignore=("AO2",))], ["AO101", "AO102", "AO301", "XT101"]),
        # more specific wins: ignore a block but keep one code of it
        (
            [Selection(select=("AO",), ignore=("AO2",), extend_select=("AO201",))],
            ["AO101", "AO102", "AO201", "AO301"],
        ),
        ([Selection(select=("AO2",), ignore=("AO201",))], ["AO202"]),
        # at equal specificity ignore beats select
        ([Selection(select=("AO201",), ignore=("AO201",))], []),
        # the command line's select replaces the config's selection (and its ignores)...
        ([Selection(select=("AO1",), ignore=("AO101",)), Selection(select=("AO101",))], ["AO101"]),
        # ...while extend-select and ignore add to it
        (
            [Selection(select=("AO1",)), Selection(extend_select=("XT",), ignore=("AO102",))],
            ["AO101", "XT101"],
        ),
        ([Selection(select=("ao1",))], ["AO101", "AO102"]),  # case-insensitive
    ],
)
def test_selection_semantics(layers: list[Selection], expected: list[str]) -> None:
    assert sorted(resolve_selection(CODES, layers)) == expected


@pytest.mark.parametrize(
    ("selector", "words"),
    [
        ("AO999", "matches no rule"),
        ("A-O1", "invalid rule selector"),
        ("AO2O1", "did you mean AO201"),
    ],
)
def test_bad_selectors(selector: str, words: str) -> None:
    with pytest.raises(RuleError, match=words):
        resolve_selection(CODES, [Selection(ignore=(selector,), source="--ignore")])


def test_fingerprint_depends_on_selection() -> None:
    registry = load_fixture_rules()
    all_rules = registry.all()
    assert registry.fingerprint(all_rules) == registry.fingerprint(list(reversed(all_rules)))
    assert registry.fingerprint(all_rules) != registry.fingerprint(all_rules[:1])
