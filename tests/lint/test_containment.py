"""A rule's bug costs only its own findings and fixes: lint keeps every other rule's findings and
exits 2; rewrite applies every other fix, writes the file, and names what it skipped (exit 2)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoopt.cli import main
from autoopt.lint.engine import registry as registry_module
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.runner import lint_bytes
from autoopt.lint.rewrite.apply import fix_source

from .fixtures import FIXTURE_RULES, FIXTURES

BROKEN_RULES = FIXTURES / "broken_rules"
REGISTRY = load_registry([FIXTURE_RULES, BROKEN_RULES], include_builtin=False)
CUDA, PRINT = REGISTRY.rules["XT101"], REGISTRY.rules["XT201"]
CRASH, BROKEN_FIX = REGISTRY.rules["XT901"], REGISTRY.rules["XT902"]

SOURCE = "x = y.cuda()\ncrash_here()\nprint(1)\n"

TRAIN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(4, 2).cuda()
    loader = DataLoader(ds, batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.cuda()), y)
        loss.backward()
        optimizer.step()
        crash_here()
        breaks_syntax()
    """
).lstrip()


def _project(root: Path, files: dict[str, str]) -> Path:
    folders = ", ".join(f'"{p.as_posix()}"' for p in (FIXTURE_RULES, BROKEN_RULES))
    (root / "pyproject.toml").write_text(f"[tool.autoopt]\nextra-rules = [{folders}]\n")
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_crashing_rule_keeps_the_other_rules_findings() -> None:
    result = lint_bytes(SOURCE.encode(), "a.py", [CRASH, CUDA, PRINT])
    assert [(d.code, d.line) for d in result.diagnostics] == [("XT101", 1), ("XT201", 3)]
    (error,) = result.errors
    assert error.kind == "internal" and error.line == 2
    assert "internal error in rule XT901 (crash-on-call): AttributeError" in error.reason
    assert "crash_on_call.py:" in error.reason  # where it was raised, for the rule's author


def test_lint_cli_reports_the_crash_with_every_other_finding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(tmp_path, {"a.py": SOURCE, "b.py": "print(2)\n"})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry_module, "BUILTIN_PACKAGE", None)
    result = CliRunner().invoke(main, ["lint", "--no-cache"], catch_exceptions=False)
    assert result.exit_code == 2
    for expected in ("a.py:1:5: XT101", "a.py:3:1: XT201", "b.py:1:1: XT201"):
        assert expected in result.output
    assert "a.py:2:1: error: internal error in rule XT901 (crash-on-call)" in result.output
    assert "1 file linted without the rules that failed on them" in result.output


def test_fix_source_skips_only_the_failing_rules() -> None:
    source = "crash_here()\nbreaks_syntax()\nopt.zero_grad()\n"
    zero_grad = REGISTRY.rules["XT301"]
    result = fix_source(source, [CRASH, BROKEN_FIX, zero_grad], unsafe=True)
    assert result.source == "crash_here()\nbreaks_syntax()\nopt.zero_grad(set_to_none=True)\n"
    skipped = {s.code: s.reason for s in result.skipped}
    assert set(skipped) == {"XT901", "XT902"}
    assert "internal error in rule XT901" in skipped["XT901"]
    assert "its fix failed: SyntaxError" in skipped["XT902"]


def test_rewrite_cli_applies_the_other_fixes_and_names_the_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _project(tmp_path, {"train.py": TRAIN, "other.py": TRAIN})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["rewrite", "."], catch_exceptions=False)
    assert result.exit_code == 2
    for name in ("train.py", "other.py"):  # the run went on past the first file
        text = (tmp_path / name).read_text()
        assert "pin_memory=True" in text and "model.compile()" in text  # AO102, AO301
        assert "crash_here()\n" in text and "breaks_syntax()\n" in text
        assert f"error: {name}: XT901 fix skipped: internal error in rule XT901" in result.stderr
        assert f"error: {name}: XT902 fix skipped: its fix failed: SyntaxError" in result.stderr
    assert "Rewrote 2 files" in result.stderr


@pytest.mark.parametrize("rebinding", ["with open('f') as kw:\n    pass\n", "import json as kw\n"])
def test_kwargs_dict_rebound_by_as_is_not_read(rebinding: str) -> None:
    """`as kw` (an AsName) in the scope of a `**kw` call crashed the DataLoader rules."""

    builtin = load_registry().all()
    source = (
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "kw = dict(batch_size=32, num_workers=4)\n" + rebinding + "loader = DataLoader(ds, **kw)\n"
        "for x, y in loader:\n    model(x.cuda()).sum().backward()\n"
    )
    result = lint_bytes(source.encode(), "a.py", builtin)
    assert result.errors == []
    # `kw` may be anything after the rebinding: AO101 (num_workers) cannot say it is missing.
    assert "AO101" not in {d.code for d in result.diagnostics}


def test_rewrite_cli_goes_on_after_an_engine_bug(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug outside any rule (here: --wrap) costs that file, not the run."""
    import autoopt.cli.rewrite as cli_rewrite

    real = cli_rewrite.wrap_source

    def flaky(source: str, *, path: str = "<string>"):  # type: ignore[no-untyped-def]
        if "first" in str(path):
            raise AttributeError("'AsName' object has no attribute 'target'")
        return real(source, path=path)

    monkeypatch.setattr(cli_rewrite, "wrap_source", flaky)
    script = TRAIN.replace("    crash_here()\n    breaks_syntax()\n", "")
    _project(tmp_path, {"first.py": script, "second.py": script})
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["rewrite", "--wrap", "."], catch_exceptions=False)
    assert result.exit_code == 2
    assert "error: first.py: internal error in --wrap: AttributeError" in result.stderr
    assert (tmp_path / "first.py").read_text() == script
    assert "autoopt.optimize(" in (tmp_path / "second.py").read_text()
