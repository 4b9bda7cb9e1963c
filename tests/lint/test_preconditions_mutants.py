"""What fixes assume, checked (`autoopt.lint.fixes.preconditions`), at the edges the rule
examples did not reach: AO301's compile fix is declined exactly when the script differentiates
through a gradient, with the reason word for word. Each case kills mutants that survived
`make mutation` (docs/benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

import pytest

from autoopt.lint.engine import analyze
from rules.torch_compile_model import TorchCompileModel

LOOP = """
import torch
model = Net().cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = model(x).sum()
    {backward}
    opt.step()
"""


def _message(backward: str) -> str:
    source = textwrap.dedent(LOOP.format(backward=backward))
    (finding,) = analyze(source, "<string>", [TorchCompileModel]).findings
    return finding.message if finding.fix is None else "fixed"


def _declined(twice: str) -> str:
    return (
        f"model `model` is trained without torch.compile (not fixed: the script runs a {twice}, "
        "which torch.compile's aot_autograd does not support)"
    )


@pytest.mark.parametrize(
    ("backward", "want"),
    [
        ("loss.backward()", "fixed"),
        ("loss.backward(create_graph=False)", "fixed"),
        ("loss.backward(retain_graph=True)", "fixed"),
        ("loss.backward(None, True)", "fixed"),  # positional retain_graph: no create_graph
        ("loss.backward(create_graph=True)", _declined("double backward (create_graph=True)")),
        ("loss.backward(create_graph=flag)", _declined("double backward (create_graph=True)")),
        (
            "torch.autograd.grad(loss, x, create_graph=True)[0].sum().backward()",
            _declined("double backward (torch.autograd.grad, e.g. a gradient penalty)"),
        ),
    ],
)
def test_compile_is_declined_exactly_for_a_double_backward(backward: str, want: str) -> None:
    assert _message(backward) == want
