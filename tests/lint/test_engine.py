"""The engine: pre-filter, deferred metadata, errors per file, cache, parallel == serial, and
never executing the code it reads."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest

from autoopt.lint.engine import analysis as engine
from autoopt.lint.engine import runner
from autoopt.lint.engine.config import Options
from autoopt.lint.engine.project import load_project
from autoopt.lint.engine.runner import lint_bytes, run_lint
from autoopt.lint.tree import metadata

from .fixtures import keep_cwd, load_fixture_rules, write_project

REGISTRY = load_fixture_rules()
RULES = REGISTRY.all()
CUDA = REGISTRY.rules["XT101"]
PRINT = REGISTRY.rules["XT201"]

pytestmark = pytest.mark.usefixtures(keep_cwd.__name__)


def _lint(root: Path, **options: object):  # type: ignore[no-untyped-def]
    os.chdir(root)
    project = load_project([root], Options(**options), registry=REGISTRY)  # type: ignore[arg-type]
    return run_lint(project, jobs=1)


def test_analyze_runs_fixture_rule() -> None:
    analysis = engine.analyze("import torch\nx = torch.ones(1).cuda()\n", "t.py", [CUDA])
    assert [(f.code, f.line, f.column) for f in analysis.findings] == [("XT101", 2, 5)]
    assert analysis.findings[0].fix is not None


def test_prefilter_skips_parse_when_no_trigger(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = cst.parse_module
    monkeypatch.setattr(runner.cst, "parse_module", lambda s: calls.append(s) or real(s))
    skipped = lint_bytes(b"x = 1\ny = 2\n", "a.py", RULES)
    assert not skipped.parsed and calls == []
    hit = lint_bytes(b"y.cuda()\n", "b.py", RULES)
    assert hit.parsed and len(calls) == 1
    assert [d.code for d in hit.diagnostics] == ["XT101"]


def test_triggers_in_comments_and_docstrings_do_not_count() -> None:
    source = '"""Call .cuda( on it."""\n# x.cuda()\ns = "#"  # print\n'
    assert engine.active_rules(RULES, source) == []
    assert engine.active_rules(RULES, 'os.environ["A"] = ".cuda("\n') == [CUDA]
    assert engine.strip_prose("a = '#'  # c\n'''x'''\n") == "a = '#'   \n \n"


def test_positions_are_computed_only_for_files_with_findings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generated: list[str] = []
    whole, one = metadata.Positions._load, metadata.Positions._from_statement

    def spy_whole(self):  # type: ignore[no-untyped-def]
        generated.append("module")
        return whole(self)

    def spy_one(self, node):  # type: ignore[no-untyped-def]
        generated.append("statement")
        return one(self, node)

    monkeypatch.setattr(metadata.Positions, "_load", spy_whole)
    monkeypatch.setattr(metadata.Positions, "_from_statement", spy_one)
    # The trigger is there, but no `.cuda()` call without args: nothing to report.
    engine.analyze("x.cuda(0)\n", "t.py", [CUDA])
    assert not generated
    # A finding: the code of its statement is generated, not the module's.
    engine.analyze("import os\nx.cuda()\ny = 1\n", "t.py", [CUDA])
    assert generated == ["statement"]


def test_target_version_gates_rules() -> None:
    old = REGISTRY.rules["XT301"]
    assert lint_bytes(b"opt.zero_grad()\n", "a.py", [old], (1, 13)).diagnostics
    assert not lint_bytes(b"opt.zero_grad()\n", "a.py", [old], (2, 0)).diagnostics
    assert lint_bytes(b"opt.zero_grad()\n", "a.py", [old], None).diagnostics


@pytest.mark.parametrize(
    ("data", "kind", "line", "words"),
    [
        (b"x = 1\nprint(1\n", "parse", 2, "syntax error: '(' was never closed"),
        (b"print(1)\nx = '\xff\xfe'\n", "decode", 2, "invalid byte 0xff"),
        (b"\x7fELF\x02\x01\x00\x00print(", "decode", 1, "binary file"),
        (b"# -*- coding: nope -*-\nprint(1)\n", "decode", 1, "cannot decode"),
    ],
    ids=["syntax-error", "non-utf8", "binary", "bad-coding-cookie"],
)
def test_bad_input_becomes_a_file_error(data: bytes, kind: str, line: int, words: str) -> None:
    result = lint_bytes(data, "bad.py", RULES)
    assert result.diagnostics == []
    (error,) = result.errors
    assert error.kind == kind and error.line == line and words in error.reason


def test_coding_cookie_is_honoured() -> None:
    data = "# -*- coding: latin-1 -*-\ns = 'caf\xe9'\nprint(s)\n".encode("latin-1")
    result = lint_bytes(data, "latin.py", [PRINT])
    assert not result.errors and [d.line for d in result.diagnostics] == [3]


def test_empty_file_is_clean() -> None:
    result = lint_bytes(b"", "empty.py", RULES)
    assert result.errors == [] and result.diagnostics == []


def test_crashing_rule_is_reported_with_its_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def visit_Call(self, node):  # type: ignore[no-untyped-def]  # (libcst finds it by name)
        raise ValueError("kaput")

    monkeypatch.setattr(CUDA, "visit_Call", visit_Call)
    (error,) = lint_bytes(b"x.cuda()\n", "a.py", [CUDA]).errors
    assert error.kind == "internal" and "rule XT101" in error.reason and "kaput" in error.reason


def test_big_file_is_linted(tmp_path: Path) -> None:
    filler = "# " + "y" * 2000 + "\n"  # long lines: 5 MB, but few nodes to keep the test quick
    body = filler * (5 * 1024 * 1024 // len(filler)) + "z = w.cuda()\n"
    write_project(tmp_path, {"big.py": body, "small.py": "print(1)\n"})
    report = _lint(tmp_path, select=("XT",))
    assert (tmp_path / "big.py").stat().st_size > 5_000_000
    found = {(p, d.code, d.line) for p, d in report.diagnostics}
    n_lines = body.count("\n")
    assert found == {("big.py", "XT101", n_lines), ("small.py", "XT201", 1)}


def test_cache_hits_and_invalidation(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "print(1)\n", "b.py": "x = y.cuda()\n"})
    first = _lint(tmp_path)
    assert first.cached == 0 and len(first.diagnostics) == 2
    assert (tmp_path / ".autoopt_cache" / ".gitignore").is_file()
    second = _lint(tmp_path)
    assert second.cached == 2
    assert second.diagnostics == first.diagnostics
    # A changed file is re-linted, the other one still comes from the cache.
    (tmp_path / "a.py").write_text("x = 1\nprint(2)\n")
    third = _lint(tmp_path)
    assert third.cached == 1
    assert [(p, d.line) for p, d in third.diagnostics if d.code == "XT201"] == [("a.py", 2)]
    # Another rule set (different selection) is another cache key: nothing is reused.
    fourth = _lint(tmp_path, select=("XT101",))
    assert fourth.cached == 0 and [d.code for _, d in fourth.diagnostics] == ["XT101"]
    # --no-cache neither reads nor counts cached results.
    assert _lint(tmp_path, no_cache=True).cached == 0


def test_cache_invalidated_when_a_rule_source_changes(tmp_path: Path) -> None:
    rules_dir = tmp_path / "myrules"
    rules_dir.mkdir()
    rule_file = rules_dir / "r.py"
    template = (Path(__file__).parent / "fixtures" / "rules" / "print_call.py").read_text()
    rule_file.write_text(template)
    write_project(tmp_path / "proj", {"a.py": "print(1)\n"})
    from autoopt.lint.engine import registry as registry_module

    def lint_with_rule_file():  # type: ignore[no-untyped-def]
        os.chdir(tmp_path / "proj")
        reg = registry_module.load_registry([rules_dir], include_builtin=False)
        registry_module._file_hashes.clear()  # a new process would re-hash the sources
        project = load_project([tmp_path / "proj"], Options(), registry=reg)
        return run_lint(project, jobs=1)

    assert lint_with_rule_file().cached == 0
    assert lint_with_rule_file().cached == 1
    rule_file.write_text(template + "\n# edited\n")
    assert lint_with_rule_file().cached == 0


def test_cache_invalidated_when_a_helper_module_changes(tmp_path: Path) -> None:
    """Rules import helpers (their folder's modules, the engine's nodes/calls/...): editing one
    changes what the rules find, so it must change the cache key too."""
    from autoopt.lint.engine import registry as registry_module
    from autoopt.lint.tree import nodes

    rules_dir = tmp_path / "myrules"
    rules_dir.mkdir()
    template = (Path(__file__).parent / "fixtures" / "rules" / "print_call.py").read_text()
    (rules_dir / "r.py").write_text(template)
    helper = rules_dir / "_helpers.py"
    helper.write_text("WORDS = ('print',)\n")
    rules = registry_module.load_registry([rules_dir], include_builtin=False).all()

    def fingerprint() -> str:
        registry_module._file_hashes.clear()  # a new process would re-hash the sources
        return registry_module.rules_fingerprint(rules)

    first = fingerprint()
    assert fingerprint() == first
    helper.write_text("WORDS = ('print', 'log')\n")
    second = fingerprint()
    assert second != first
    # An engine helper module: pretend nodes.py was edited.
    registry_module._file_hashes.clear()
    registry_module._file_hashes[str(Path(nodes.__file__))] = "edited"
    assert registry_module.rules_fingerprint(rules) != second


def test_file_no_rule_needs_still_gets_a_syntax_check(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    real = cst.parse_module
    monkeypatch.setattr(runner.cst, "parse_module", lambda s: parsed.append(s) or real(s))
    result = lint_bytes(b"x = 1\ndef f(:\n    pass\n", "broken.py", RULES)
    assert parsed == []  # still not parsed by libcst: no rule's triggers are in it
    (error,) = result.errors
    assert (error.kind, error.line) == ("parse", 2) and "syntax error" in error.reason
    # What only the compiler rejects, and what it merely warns about.
    assert lint_bytes(b"x = 1\nreturn x\n", "r.py", RULES).errors[0].kind == "parse"
    assert lint_bytes(b"s = '\\d'\n", "w.py", RULES).errors == []
    # Notebooks may await at the top level (IPython runs them that way).
    assert lint_bytes(b"await f()\n", "n.py", RULES).errors[0].kind == "parse"
    notebook = b'{"cells": [{"cell_type": "code", "source": ["await f()\\n"]}], "nbformat": 4}'
    assert lint_bytes(notebook, "n.ipynb", RULES, notebook=True).errors == []


def test_cli_exits_2_on_a_syntax_error_no_rule_needed(tmp_path: Path) -> None:
    write_project(tmp_path, {"broken.py": "x = (\n", "ok.py": "x = 1\n"})
    report = _lint(tmp_path)
    assert report.exit_code() == 2
    assert [(p, e.kind, e.line) for p, e in report.errors] == [("broken.py", "parse", 1)]


def test_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    write_project(tmp_path, {"a.py": "print(1)\n"})
    _lint(tmp_path)
    for path in (tmp_path / ".autoopt_cache").rglob("*.json"):
        path.write_text("{not json")
    report = _lint(tmp_path)
    assert report.cached == 0 and len(report.diagnostics) == 1


@pytest.mark.skipif(not runner.fork_available(), reason="parallel linting needs fork")
def test_parallel_results_equal_serial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        f"pkg/m{i:02d}.py": "import torch\n" + "x.cuda()\nprint(x)\n" * (i % 4) for i in range(40)
    }
    files["pkg/broken.py"] = "def f(:\n    print(1)\n"
    write_project(tmp_path, files)
    os.chdir(tmp_path)
    project = load_project([tmp_path], Options(no_cache=True), registry=REGISTRY)
    serial = run_lint(project, jobs=1)
    pools: list[object] = []
    real_pool = runner.ProcessPoolExecutor

    class CountingPool(real_pool):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            pools.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(runner, "ProcessPoolExecutor", CountingPool)
    monkeypatch.setattr(runner, "MIN_PARALLEL_FILES", 2)
    parallel = run_lint(project, jobs=2)
    assert len(pools) == 1  # the work really ran in worker processes
    assert parallel.diagnostics == serial.diagnostics
    assert parallel.errors == serial.errors and len(serial.errors) == 1
    assert len(serial.diagnostics) == sum(2 * (i % 4) for i in range(40))


def test_never_executes_linted_code(tmp_path: Path) -> None:
    marker = tmp_path / "EXECUTED"
    evil = (
        "import pathlib, sys, os\n"
        f"pathlib.Path({str(marker)!r}).write_text('ran')\n"
        "os._exit(3)\n"
        "sys.exit(4)\n"
        "x = torch.ones(1).cuda()\n"
    )
    notebook = (
        '{"cells": [{"cell_type": "code", "source": ['
        f'"open({str(marker)!r}, \\"w\\").write(\\"nb\\")\\n", "y.cuda()\\n"]'
        '}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
    )
    write_project(
        tmp_path,
        {"evil.py": evil, "__init__.py": evil, "conftest.py": evil, "nb.ipynb": notebook},
    )
    report = _lint(tmp_path, select=("XT101",))
    assert not marker.exists()
    assert sorted(p for p, _ in report.diagnostics) == [
        "__init__.py",
        "conftest.py",
        "evil.py",
        "nb.ipynb",
    ]


# Every kind of nesting the visit order depends on: decorators, parameters with defaults and
# annotations, comprehensions, f-strings, match patterns, `except*`, chained comparisons.
_VISIT_ORDER_SOURCE = """
import torch
from torch import nn as tnn
@dec(1)
class M(tnn.Module, metaclass=Meta):
    x: int = 1 < 2 <= 3 is not 4 not in 5
    def __init__(self, *a, b: "int" = 1, **k) -> None:
        super().__init__(); self.l = tnn.Linear(2, 3)
    async def f(self, x, /, y=3, *, z):
        return [v async for v in x if v] + {k: v for k, v in y} @ x[1:2, ...]
def g(a, b, c):
    global z
    with torch.no_grad() as q, open(f"{a!r:>{b}} x") as r:
        lambda x, *y: (yield from x)
    match a:
        case [1, *rest] | {"k": v, **kw} if v: pass
        case M(x=1): pass
    try: pass
    except* ValueError as e: raise e from None
    finally: del a
    for i in range(3): continue
    else: b += 1; assert a, "m"; print(*a, **b)
"""


class _Recorder(cst.BatchableCSTVisitor):
    """Notes every visit and leave, of every node class."""

    def __init__(self, log: list[tuple[str, int]], attributes: bool = False) -> None:
        super().__init__()
        self.log = log
        self.attributes = attributes

    def get_visitors(self):  # type: ignore[no-untyped-def]
        out = {}
        for name in dir(cst):
            kind = getattr(cst, name)
            if isinstance(kind, type) and issubclass(kind, cst.CSTNode):
                out[f"visit_{name}"] = lambda node: self.log.append(("visit", id(node)))
                out[f"leave_{name}"] = lambda node: self.log.append(("leave", id(node)))
        if self.attributes:
            out["visit_Call_func"] = lambda node: self.log.append(("visit func", id(node)))
        return out


@pytest.mark.parametrize("attributes", [False, True])
def test_rules_are_visited_in_libcsts_order(attributes: bool) -> None:
    """The engine's own batched visit (off the tree's preorder) calls the same methods on the
    same nodes in the same order as libcst's traversal; attribute visitors get libcst's."""
    module = cst.parse_module(_VISIT_ORDER_SOURCE)
    expected: list[tuple[str, int]] = []
    cst.visit_batched(module, [_Recorder(expected, attributes)])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    parents = metadata.install(wrapper)
    got: list[tuple[str, int]] = []
    engine._visit_batched(wrapper, parents.tree, [_Recorder(got, attributes)])
    assert got == expected
    assert sum(kind == "visit" for kind, _ in got) == len(parents.nodes)
