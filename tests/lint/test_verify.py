"""Every edit is verified before it is written (autoopt.lint.rewrite.verify): it parses, binds every name
it uses, and adds no finding of any rule; a fix that fails is left out alone and named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

import autoopt.cli.rewrite as cli_rewrite
from autoopt.lint.engine.analysis import analyze
from autoopt.lint.engine.config import parse_target_version
from autoopt.lint.engine.registry import load_registry
from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.rewrite.apply import fix_source
from autoopt.lint.rewrite.verify import unbound_names, verify_edit
from autoopt.lint.wrap.insert import wrap_source

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
        model.cuda()
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


# ----- a name bound on some paths only (issue 21: word_language_model's optimizer) ----------
SGD_UNDER_A_FLAG = src(
    """
    import torch
    if args.use_sgd:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        if args.use_sgd:
            optimizer.step()
        else:
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
        run(loss)
    """
)


class ZeroGradFirst(Rule):
    """Inserts `optimizer.zero_grad(set_to_none=True)` at the top of every `for` body: on the
    default path of SGD_UNDER_A_FLAG, where `optimizer` is unbound."""

    code = "XV004"
    name = "zero-grad-first"
    message = "zero the gradients"
    fix_safety = FixSafety.SAFE

    def visit_For(self, node: cst.For) -> None:
        if not isinstance(node.target, cst.Tuple):
            return
        body = node.body
        line = cst.parse_statement("optimizer.zero_grad(set_to_none=True)\n")
        new_body = body.with_changes(body=[line, *body.body])
        self.report(node, fix=Fix({body: new_body}))


def test_a_use_of_a_name_bound_under_an_if_is_rejected_and_the_other_fix_kept() -> None:
    result = fix_source(SGD_UNDER_A_FLAG, [ZeroGradFirst, RenameRun])
    assert "zero_grad" not in result.source
    assert "print(loss)" in result.source  # the good fix is kept
    assert result.rejected  # (tried again in the pass after RenameRun changed the loop)
    for rejected in result.rejected:
        assert rejected.code == "XV004"
        assert "'optimizer' may be unbound where the edit uses it" in rejected.reason


def test_verify_edit_names_a_maybe_unbound_name() -> None:
    zero_first = SGD_UNDER_A_FLAG.replace(
        "    loss = criterion", "    optimizer.zero_grad()\n    loss = criterion"
    )
    verdict = verify_edit(SGD_UNDER_A_FLAG, zero_first, rules=[])
    assert verdict.problems == [
        "'optimizer' may be unbound where the edit uses it (bound on some paths only)"
    ]
    # Under the flag that binds it, the same call is fine.
    under_flag = SGD_UNDER_A_FLAG.replace(
        "        optimizer.step()\n", "        optimizer.step()\n        optimizer.zero_grad()\n"
    )
    assert verify_edit(SGD_UNDER_A_FLAG, under_flag, rules=[]).ok


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # bound only in the loop's body, read after it
        (
            "for x in loader:\n    loss = f(x)\n",
            "for x in loader:\n    loss = f(x)\nprint(loss)\n",
        ),
        # bound only in the try body, read in the handler
        (
            "try:\n    model = load()\nexcept OSError:\n    pass\n",
            "try:\n    model = load()\nexcept OSError:\n    print(model)\n",
        ),
        # read after a `del` under an `if` (an unconditional one is pyflakes' to see)
        ("x = 1\nif flag:\n    del x\n", "x = 1\nif flag:\n    del x\nprint(x)\n"),
        # `except E as e` unbinds `e`, even one bound before the `try`
        (
            "e = 0\ntry:\n    run()\nexcept ValueError as e:\n    pass\n",
            "e = 0\ntry:\n    run()\nexcept ValueError as e:\n    pass\nprint(e)\n",
        ),
    ],
    ids=["after-loop", "in-except", "after-del", "after-handler"],
)
def test_a_read_that_some_path_reaches_unbound_is_rejected(before: str, after: str) -> None:
    verdict = verify_edit(before, after, rules=[])
    assert not verdict.ok
    assert "may be unbound where the edit uses it" in verdict.reason()


def test_a_read_the_script_already_makes_unguarded_may_be_repeated() -> None:
    """Past the script's own read of a maybe-unbound name, the name is bound (the read raised
    otherwise): a fix reading it again below adds no NameError."""
    before = src(
        """
        if args.opt == "sgd":
            optimizer = make_sgd()
        elif args.opt == "adam":
            optimizer = make_adam()
        scheduler = make_scheduler(optimizer)
        for x in loader:
            step(x)
        """
    )
    after = before.replace("    step(x)", "    optimizer.zero_grad()\n    step(x)")
    assert verify_edit(before, after, rules=[]).ok


def test_an_undefined_name_is_named_once() -> None:
    """A name pyflakes already reports as undefined is not named a second time."""
    before = "if flag:\n    x = 1\n"
    after = "print(x)\nif flag:\n    x = 1\n"
    verdict = verify_edit(before, after, rules=[])
    assert len(verdict.problems) == 1 and "'x'" in verdict.problems[0]


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
from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid


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


def test_wrap_insertion_reading_a_name_bound_under_an_if_is_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--wrap` goes through the same check: an insertion handing over an optimizer that only
    one branch of an `if` creates is declined."""
    flagged = (
        WRAPPABLE.replace(
            "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
            "if use_sgd:\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        )
        .replace("    optimizer.zero_grad()\n", "")
        .replace("    optimizer.step()\n", "    if use_sgd:\n        optimizer.step()\n")
    )
    line = "model, loader, optimizer = autoopt.optimize(model, loader, optimizer)\n"

    def insert_before_loop(source: str, *, path: object = None):  # noqa: ANN202 - WrapResult
        good = wrap_source(WRAPPABLE, path=None)
        text = source.replace("import torch\n", "import torch\nimport autoopt\n", 1)
        text = text.replace("for x, y in loader:", line + "for x, y in loader:")
        return type(good)(text, source, "inserted", inserted=(line.strip(),))

    (tmp_path / "pyproject.toml").write_text("[tool.autoopt]\n")
    (tmp_path / "train.py").write_text(flagged)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_rewrite, "wrap_source", insert_before_loop)
    result = CliRunner().invoke(cli_rewrite.rewrite, ["train.py", "--wrap"])
    assert (tmp_path / "train.py").read_text() == flagged
    assert "'optimizer' may be unbound" in result.output
    assert "declined 1" in result.output
