"""Every edit is verified before it is written (autoopt.lint.verify): it parses, binds every name
it uses, and adds no finding of any rule; a fix that fails is left out alone and named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

import autoopt.cli.rewrite as cli_rewrite
from autoopt.lint.config import parse_target_version
from autoopt.lint.engine import analyze
from autoopt.lint.registry import load_registry
from autoopt.lint.rewrite import fix_source
from autoopt.lint.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.verify import unbound_names, verify_edit
from autoopt.lint.wrap import wrap_source

RULES = load_registry().all()


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


class SeedFirst(Rule):
    """Inserts `torch.manual_seed(0)` as the file's first line: above `import torch` (the
    AO602 breakage of issue 21)."""

    code = "XV001"
    name = "seed-first"
    message = "seed first"
    fix_safety = FixSafety.SAFE

    def visit_Module(self, node: cst.Module) -> None:
        first = node.body[0]
        line = cst.parse_statement("torch.manual_seed(0)\n")
        self.report(first, fix=Fix({first: cst.FlattenSentinel([line, first])}))


class RenameRun(Rule):
    """A good fix beside the bad one: `run()` -> `print()`."""

    code = "XV002"
    name = "rename-run"
    message = "print instead"
    fix_safety = FixSafety.SAFE

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "run":
            self.report(node, fix=Fix({node: node.with_changes(func=cst.Name("print"))}))


class ItemPerStep(Rule):
    """Writes `total += loss.item()` in the step loop: what AO702 flags (issue 21's AO402)."""

    code = "XV003"
    name = "item-per-step"
    message = "use item"
    fix_safety = FixSafety.SAFE

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if isinstance(node.value, cst.Name) and node.value.value == "loss":
            item = cst.parse_expression("loss.item()")
            self.report(node, fix=Fix({node.value: item}))


def test_a_line_above_the_import_it_needs_is_rejected_and_the_other_fix_kept() -> None:
    code = "import torch\nrun(torch.zeros(1))\n"
    result = fix_source(code, [SeedFirst, RenameRun])
    assert result.source == "import torch\nprint(torch.zeros(1))\n"
    (rejected,) = result.rejected
    assert rejected.code == "XV001"
    assert "'torch'" in rejected.reason and "not defined" in rejected.reason
    assert not result.unsafe_available and not result.declined  # listed once, as rejected


def test_a_fix_that_writes_what_another_rule_flags_is_rejected() -> None:
    code = src(
        """
        total = 0.0
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            total += loss
        print(total / len(loader))
        """
    )
    rules = [ItemPerStep, load_registry().rules["AO702"]]
    result = fix_source(code, rules)
    assert result.source == code
    (rejected,) = result.rejected
    assert rejected.code == "XV003" and "AO702" in rejected.reason
    alone = fix_source(code, [ItemPerStep])  # the rule set is what verification checks
    assert "loss.item()" in alone.source


def test_use_before_assignment_in_a_function_is_rejected() -> None:
    before = "def f():\n    x = 1\n    return x\n"
    after = "def f():\n    print(x)\n    x = 1\n    return x\n"
    verdict = verify_edit(before, after, rules=[])
    assert not verdict.ok
    assert "'x'" in verdict.reason()


def test_a_free_name_of_a_fragment_may_be_used_again() -> None:
    """Fragments (rule examples, a script's star-imported names) use names they never bind: one
    more use of such a name is no less defined than the others."""
    before = "opt.step()\n"
    after = "opt.zero_grad()\nopt.step()\n"
    assert verify_edit(before, after, rules=[]).ok
    # ... but a name the file binds, used above its binding, is not
    bound = "import torch\nx = torch.ones(1)\n"
    assert not verify_edit(bound, "torch.manual_seed(0)\n" + bound, rules=[]).ok


def test_an_edit_that_does_not_parse_is_rejected() -> None:
    verdict = verify_edit("x = 1\n", "x = (1\n", rules=[])
    assert not verdict.ok and "does not parse" in verdict.reason()


def test_unbound_names_counts_by_kind_and_name() -> None:
    names = unbound_names("print(a)\nprint(a)\ndef f():\n    b\n")
    assert names is not None
    assert names.unbound[("UndefinedName", "a")] == 2
    assert unbound_names("x = (") is None


def _version(example: Valid | Invalid) -> tuple[int, int] | None:
    text = getattr(example, "target_version", None)
    return parse_target_version(text) if text else None


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(ex, id=f"{rule.code}-{kind}{i}")
        for rule in RULES
        for kind, examples in (("invalid", rule.INVALID), ("valid", rule.VALID))
        for i, ex in enumerate(examples)
    ],
)
def test_rewrite_then_lint_leaves_nothing_the_rewrite_could_fix(example: Valid | Invalid) -> None:
    """Every rule's examples, rewritten with every rule and --unsafe-fixes: no fix is rejected
    (fixes agree with each other and with lint), and lint of the result offers no fix."""
    version = _version(example)
    result = fix_source(example.code, RULES, unsafe=True, target_version=version)
    assert not result.rejected, result.rejected
    assert not result.skipped, result.skipped
    left = analyze(result.source, "example.py", RULES, version).findings
    assert not [(f.code, f.line) for f in left if f.fix is not None]


# ----- the CLI: a fix that fails verification is not written, and the summary says why --------
_SEED_RULE = '''
import libcst as cst
from autoopt.lint.rule import Fix, FixSafety, Invalid, Rule, Valid


class SeedFirst(Rule):
    """Inserts torch.manual_seed(0) above everything."""

    code = "XV001"
    name = "seed-first"
    message = "seed first"
    fix_safety = FixSafety.SAFE
    VALID = [Valid("x = 1\\n")]
    INVALID = [Invalid("import torch\\n", line=1)]

    def visit_Module(self, node):
        if "torch" not in self.context.source:
            return
        first = node.body[0]
        line = cst.parse_statement("torch.manual_seed(0)\\n")
        self.report(first, fix=Fix({first: cst.FlattenSentinel([line, first])}))
'''


def test_cli_names_the_rejected_fix_and_leaves_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rules").mkdir()
    (tmp_path / "my_rules" / "seed_first.py").write_text(_SEED_RULE)
    (tmp_path / "pyproject.toml").write_text('[tool.autoopt]\nextra-rules = ["my_rules"]\n')
    script = "import torch\nx = torch.ones(1)\n"
    (tmp_path / "train.py").write_text(script)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        cli_rewrite.rewrite,
        ["train.py", "--allow-project-rules", "--select", "XV001"],
        catch_exceptions=False,
    )
    assert (tmp_path / "train.py").read_text() == script
    assert "not applied: train.py:1: XV001" in result.output
    assert "'torch'" in result.output and "failed verification" in result.output
    assert result.exit_code == 0


WRAPPABLE = src(
    """
    import torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(4, 2)
    loader = DataLoader(ds, batch_size=8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    """
)


def test_wrap_insertion_that_breaks_the_script_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--wrap` goes through the same verification: an insertion naming an object that is not
    bound there (issue 21's progress bar bound 20 lines later) is declined, not written."""

    def broken_wrap(source: str, *, path: object = None):  # noqa: ANN202 - WrapResult
        good = wrap_source(source, path=None)
        assert good.changed
        bad = good.source.replace("autoopt.optimize(model, loader", "autoopt.optimize(model, pbar")
        return type(good)(bad, source, "inserted", inserted=("...pbar...",))

    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "train.py").write_text(WRAPPABLE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_rewrite, "wrap_source", broken_wrap)
    result = CliRunner().invoke(cli_rewrite.rewrite, ["train.py", "--wrap"])
    assert (tmp_path / "train.py").read_text() == WRAPPABLE
    assert "'pbar'" in result.output and "not applied: train.py" in result.output
    assert "declined 1" in result.output


def test_wrap_insertion_that_verifies_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "train.py").write_text(WRAPPABLE)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli_rewrite.rewrite, ["train.py", "--wrap"])
    assert result.exit_code == 0, result.output
    assert "autoopt.optimize(" in (tmp_path / "train.py").read_text()
