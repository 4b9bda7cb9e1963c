"""Speed shortcuts of issue 30's stop 24 that must give exactly what the slow path gives: the
batched visit that steps only on the nodes some rule has a method for (`engine.analysis`), the
recursive walk that indexes a fresh tree (`nodes.Preorder`, with the iterative walk as its
fallback), and the program model's module resolution with plain strings (`project_files`)."""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import pytest

from autoopt.lint.engine import analysis as engine
from autoopt.lint.program import project_files
from autoopt.lint.tree import metadata, nodes

SOURCE = """\
import torch  # a comment
from torch import nn as tnn


@dec(1)
class M(tnn.Module, metaclass=Meta):
    x: int = 1 < 2 <= 3 is not 4 not in 5

    def f(self, x, /, y=3, *, z):
        return [v for v in x if v] + {k: v for k, v in y} @ x[1:2, ...]


def g(a, b):
    with torch.no_grad() as q:
        lambda x, *y: (yield from x)
    for i in range(3):
        try:
            a.cuda(b)
        except ValueError as e:
            raise e from None
    else:
        b += 1; print(*a, **b)
"""


class _Some(cst.BatchableCSTVisitor):
    """Notes the visits of a few node classes only (the engine steps over the others)."""

    def __init__(self, log: list[tuple[str, int]]) -> None:
        super().__init__()
        self.log = log

    def get_visitors(self):  # type: ignore[no-untyped-def]
        def note(what: str):  # type: ignore[no-untyped-def]
            return lambda node: self.log.append((what, id(node)))

        return {
            "visit_Call": note("visit Call"),
            "leave_Call": note("leave Call"),
            "visit_FunctionDef": note("visit FunctionDef"),
            "leave_For": note("leave For"),
            "visit_Name": note("visit Name"),
            "leave_Module": note("leave Module"),
        }


def test_a_visit_of_some_classes_is_libcsts() -> None:
    module = cst.parse_module(SOURCE)
    expected: list[tuple[str, int]] = []
    cst.visit_batched(module, [_Some(expected)])
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    parents = metadata.install(wrapper)
    got: list[tuple[str, int]] = []
    engine._visit_batched(wrapper, parents.tree, [_Some(got), _Some(got)])
    # both visitors, in turn, at each node
    assert got[::2] == expected and got[1::2] == expected
    assert nodes.Preorder(module).ranks_of_named({"NoSuchNode"}) == ()


def _iterative(root: cst.CSTNode, monkeypatch: pytest.MonkeyPatch) -> nodes.Preorder:
    with monkeypatch.context() as patch:
        patch.setattr(nodes, "_preorder", lambda root, previous, shared: None)
        return nodes.Preorder(root)


def _same(a: nodes.Preorder, b: nodes.Preorder) -> bool:
    return (
        len(a.nodes) == len(b.nodes)
        and all(x is y for x, y in zip(a.nodes, b.nodes, strict=True))
        and a.up == b.up
        and a.end == b.end
        and a.rank == b.rank
    )


def test_the_recursive_index_equals_the_iterative_one(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cst.parse_module(SOURCE)
    assert nodes._preorder(module) is not None  # the recursive walk is the one taken
    fresh = nodes.Preorder(module)
    assert _same(fresh, _iterative(module, monkeypatch))
    assert [id(n) for n in fresh.nodes] == [id(n) for n in nodes._descend(module, True)]
    # a subtree alone (the index of any node, not only of a module)
    function = module.body[3]
    assert _same(nodes.Preorder(function), _iterative(function, monkeypatch))


def test_an_index_sharing_statements_equals_the_iterative_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = cst.parse_module(SOURCE)
    old = nodes.Preorder(before)
    body = list(before.body)
    body[3] = body[3].deep_clone()  # rebuilt by a "fix"; the others are shared
    body.insert(1, cst.parse_statement("x = 1\n"))
    after = before.with_changes(body=body)
    shared = nodes._shared_statements(after, old)
    assert len(shared) == len(before.body) - 1
    assert nodes._preorder(after, old, shared) is not None  # the recursive walk copies them
    with monkeypatch.context() as patch:
        patch.setattr(nodes, "_preorder", lambda root, previous, shared: None)
        iterative = nodes.Preorder(after, old)
    assert _same(nodes.Preorder(after, old), iterative)
    assert _same(nodes.Preorder(after), iterative)


def test_a_tree_too_deep_to_recurse_is_indexed_iteratively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = cst.parse_module("x = " + " + ".join(["a"] * 3000) + "\n")
    assert nodes._preorder(module) is None  # deeper than the recursion allows
    assert _same(nodes.Preorder(module), _iterative(module, monkeypatch))


def _reference_resolve(folder: Path, module: str, level: int) -> Path | None:
    """`project_files._resolve_from` as it was, with `Path` objects."""
    parts = [p for p in module.split(".") if p]
    if level:
        base = folder
        for _ in range(level - 1):
            base = base.parent
        folders = [base]
    else:
        if not parts:
            return None
        root = project_files.project_root(folder)
        folders = [folder]
        for parent in folder.parents:
            if root not in (parent, *parent.parents):
                break
            folders.append(parent)
    for here in folders:
        candidate = here.joinpath(*parts)
        for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if parts and file.is_file():
                return file
        if not parts and (here / "__init__.py").is_file():
            return here / "__init__.py"
    return None


def test_modules_resolve_as_with_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "utils.py"  # above the project root: never found from inside
    outside.write_text("")
    project = tmp_path / "proj"
    for name in ("pyproject.toml", "utils.py", "pkg/__init__.py", "pkg/engine.py",
                 "pkg/sub/__init__.py", "pkg/sub/train.py", "pkg/sub/deep/model.py",
                 "data/__init__.py"):  # fmt: skip
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("")
    monkeypatch.chdir(tmp_path)
    project_files.begin_run()
    linted = project / "pkg" / "sub" / "deep" / "model.py"
    asks = [("utils", 0), ("pkg.engine", 0), ("engine", 2), ("", 1), ("", 2), ("sub.train", 2),
            ("train", 2), ("data", 0), ("missing", 0), ("", 0), ("pkg", 0), ("deep.model", 1),
            ("x", 9)]  # fmt: skip
    for module, level in asks:
        got = project_files.resolve_module(linted, module, level)
        assert got == _reference_resolve(linted.parent, module, level), (module, level)
    assert project_files.resolve_module(linted, "utils") == project / "utils.py"
    assert project_files.root_of(linted) == project
    assert project_files.root_of(os.path.relpath(linted)) == project
    assert project_files.modules_named(linted, "train") == [project / "pkg/sub/train.py"]
