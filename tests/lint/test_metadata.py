"""The cheap metadata (autoopt/lint/tree/metadata.py) gives what libcst's providers give."""

from __future__ import annotations

import libcst as cst
import pytest
from libcst.metadata import ParentNodeProvider, PositionProvider, QualifiedNameProvider
from libcst.metadata.base_provider import LazyValue

from autoopt.lint.tree import metadata
from autoopt.lint.tree.nodes import children, walk

# Aliases, shadowing, scopes and the corners of libcst's name resolution.
TRICKY = """\
import torch as T
import torch.nn.functional
import os.path, numpy as np
from torch import nn, optim as O
from torch.utils.data import DataLoader as DL
from . import sibling
from ..pkg.mod import thing
from torch.cuda.amp import *

try:
    from apex import amp
except ImportError:
    amp = None

compile = lambda m: m
model = compile(nn.Linear(2, 2))
net = T.compile(model)
F = torch.nn.functional
loader = DL([1], batch_size=2)
opt = O.SGD(model.parameters(), lr=0.1)
"abc".join(os.path.join("a", "b"))
x = [T.zeros(1) for T in range(3) if T]
y = {k: v for k, v in {}.items()}
z = (p for group in opt.param_groups for p in group if p.requires_grad)
print(len(x), unknown_name, (w := 3), w)


class Trainer(nn.Module):
    scale = T.float16
    other = scale

    def __init__(self, device=T.device("cpu"), *args: T.Tensor, **kw) -> None:
        super().__init__()
        self.device = device
        T = 3
        self.t = T

    @T.no_grad()
    def evaluate(self, data: "T.Tensor"):
        global model
        model = nn.Identity()
        for i, (a, *b) in enumerate(data):
            with T.autocast("cpu") as ctx, open(a) as fh:
                print(i, a, b, ctx, fh, scale)
        def inner():
            nonlocal data
            data = 1
            return data, self
        return inner


def train(model, DL=DL):
    print(nn, torch)
    import torch.optim as nn
    opt = nn.Adam(model.parameters())
    return opt, DL
"""


def _libcst(source: str) -> tuple[cst.Module, cst.MetadataWrapper]:
    module = cst.parse_module(source)
    return module, cst.MetadataWrapper(module, unsafe_skip_copy=True)


def _names(value: object) -> set[str]:
    if isinstance(value, LazyValue):
        value = value()
    return {q.name for q in value}  # type: ignore[attr-defined]


def test_qualified_names_match_libcst() -> None:
    module, wrapper = _libcst(TRICKY)
    expected = wrapper.resolve(QualifiedNameProvider)
    ours = metadata.QualifiedNames(metadata.ParentMap(module))
    checked = 0
    for node in walk(module):
        if isinstance(node, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
            assert _names(ours[node]) == _names(expected.get(node, set())), cst.Module(
                []
            ).code_for_node(node)
            checked += 1
    assert checked > 200
    # Asked innermost first (scopes remembered from the deepest nodes up), and as strings.
    fresh = metadata.QualifiedNames(metadata.ParentMap(module))
    for node in reversed(list(walk(module))):
        if isinstance(node, cst.Name | cst.Attribute | cst.Call | cst.Subscript):
            assert fresh.names(node) == _names(expected.get(node, set()))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("T.compile(model)", {"torch.compile"}),
        ("compile(nn.Linear(2, 2))", {"compile"}),  # the script's own, not torch's
        ("DL([1], batch_size=2)", {"torch.utils.data.DataLoader"}),
        ("O.SGD(model.parameters(), lr=0.1)", {"torch.optim.SGD"}),
        ("nn.Adam(model.parameters())", {"torch.optim.Adam"}),  # rebound inside train()
    ],
)
def test_aliases_resolve_to_what_they_import(code: str, expected: set[str]) -> None:
    module = cst.parse_module(TRICKY)
    names = metadata.QualifiedNames(metadata.ParentMap(module))
    calls = [n for n in walk(module) if isinstance(n, cst.Call)]
    call = next(c for c in calls if cst.Module([]).code_for_node(c) == code)
    assert _names(names[call.func]) == expected


STAR = """\
from utils import *

optimizer = torch.optim.Adam(params)
layer = nn.Linear(2, 2)
y = F.relu(x)
np.zeros(3)
"""


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("torch.optim.Adam(params)", {"torch.optim.Adam"}),
        ("nn.Linear(2, 2)", {"torch.nn.Linear"}),
        ("F.relu(x)", {"torch.nn.functional.relu"}),
        ("np.zeros(3)", set()),  # only torch's conventional names
    ],
)
def test_torch_names_a_star_import_brings_in(code: str, expected: set[str]) -> None:
    """TensoRF's train.py never imports torch: `from utils import *` brings it in. (libcst
    leaves such names unresolved; without the star import they stay so here too.)"""
    module = cst.parse_module(STAR)
    names = metadata.QualifiedNames(metadata.ParentMap(module))
    call = next(
        n
        for n in walk(module)
        if isinstance(n, cst.Call) and cst.Module([]).code_for_node(n) == code
    )
    assert _names(names[call.func]) == expected
    plain = cst.parse_module(STAR.replace("from utils import *\n", ""))
    names = metadata.QualifiedNames(metadata.ParentMap(plain))
    call = next(
        n
        for n in walk(plain)
        if isinstance(n, cst.Call) and cst.Module([]).code_for_node(n) == code
    )
    assert _names(names[call.func]) == set()


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_parents_and_positions_match_libcst(newline: str) -> None:
    source = TRICKY.replace("\n", newline)
    module, wrapper = _libcst(source)
    parents = metadata.ParentMap(module)
    positions = metadata.Positions(module)
    expected_parents = wrapper.resolve(ParentNodeProvider)
    expected_positions = wrapper.resolve(PositionProvider)
    for node in walk(module):
        assert parents.get(node) is expected_parents.get(node)
        assert positions[node] == expected_positions[node]


def test_children_and_walk_follow_libcst_source_order() -> None:
    module = cst.parse_module(TRICKY)
    for node in walk(module):
        assert [id(c) for c in children(node)] == [id(c) for c in node.children]
    metadata.ParentMap(module)  # indexes the tree: walks become slices of its preorder
    fresh = cst.parse_module(TRICKY)  # not indexed: walked by descent
    indexed = [type(n).__name__ for n in walk(module, into_scopes=False)]
    descended = [type(n).__name__ for n in walk(fresh, into_scopes=False)]
    assert indexed == descended
    assert "Param" not in indexed and "Param" in [type(n).__name__ for n in walk(module)]


def test_install_is_used_by_rules_metadata() -> None:
    module = cst.parse_module("import torch\nx = torch.zeros(1)\n")
    wrapper = cst.MetadataWrapper(module, unsafe_skip_copy=True)
    parents = metadata.install(wrapper)
    assert wrapper.resolve(ParentNodeProvider) is parents
    assert metadata.install(wrapper) is parents  # installing twice keeps the first
    assert isinstance(wrapper.resolve(QualifiedNameProvider), metadata.QualifiedNames)
