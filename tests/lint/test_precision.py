"""`other_precision_system`: the script already trains in reduced precision its own way (issue
21: AO201 stacked autocast + GradScaler on apex amp; hand-written fp16 with a loss scale)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoopt.lint.program.precision import other_precision_system


def _check(code: str) -> str | None:
    return other_precision_system(cst.parse_module(textwrap.dedent(code).lstrip()))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n", "apex amp"),
        ("import apex\nmodel, opt = apex.amp.initialize(model, opt)\n", "apex amp"),
        (  # hand-written fp16 master weights with a dynamic loss scale
            """
            loss_scale = 2.0 ** 16
            (loss * loss_scale).backward()
            for p in params:
                p.grad.div_(loss_scale)
            """,
            "hand-written loss scaling",
        ),
        ("model = Net().cuda().half()\n", "cast to reduced precision"),
        ("model = Net().to(torch.bfloat16)\n", "cast to reduced precision"),
    ],
)
def test_detects(code: str, expected: str) -> None:
    found = _check(code)
    assert found is not None and expected in found


@pytest.mark.parametrize(
    "code",
    [
        "model = Net().to(device)\nx = x.to(torch.float32)\n",
        "scaler = torch.amp.GradScaler()\n",  # torch's own AMP: checked by AO201 itself
        "import amplitude\namplitude.half_life = 3\n",
        "# model.half() is not used here\nmodel = Net()\n",
        # A tensor cast alone is no training scheme (inference code casts inputs); only a model
        # cast to half/bf16 is: the detector looks at modules.
        "x = x.to(device, dtype=torch.float16)\n",
        "x = x.type(torch.cuda.HalfTensor)\n",
    ],
)
def test_ignores(code: str) -> None:
    assert _check(code) is None
