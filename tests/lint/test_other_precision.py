"""`precision.other_precision_system`: the reduced-precision schemes a script runs other than
torch's autocast/GradScaler, which AO201 and `--wrap` leave alone."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from autoopt.lint.program.precision import other_precision_system


def found(code: str) -> str | None:
    return other_precision_system(cst.parse_module(textwrap.dedent(code)))


@pytest.mark.parametrize(
    ("code", "why"),
    [
        ("from apex import amp\nmodel, opt = amp.initialize(model, opt)\n", "apex amp"),
        (
            "import apex\nwith apex.amp.scale_loss(loss, opt) as s:\n    s.backward()\n",
            "apex amp",
        ),
        ("model = Net()\nmodel.half()\n", "model.half()"),
        ("model = Net().cuda().bfloat16()\n", "bfloat16()"),
        ("opt = SGD(net.parameters())\nnet = net.to(torch.float16)\n", "net.to(torch.float16)"),
        ("for x in loader:\n    (loss * loss_scale).backward()\n", "hand-written loss scaling"),
        ("for x in loader:\n    (args.scale * loss).float().backward()\n", "loss scaling"),
        ("master_params = [p.float() for p in model.parameters()]\n", "master weights"),
        ("optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)\n", "FP16_Optimizer"),
        # parameters cast in place (modded-nanogpt)
        (
            "for m in model.modules():\n    m.weight.data = m.weight.data.bfloat16()\n",
            "parameters are cast",
        ),
    ],
)
def test_finds_the_scripts_own_precision_scheme(code: str, why: str) -> None:
    reason = found(code)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "code",
    [
        # torch's own AMP is not "another" system (the rules and --wrap handle it themselves)
        "scaler = torch.amp.GradScaler()\nscaler.scale(loss).backward()\n",
        # inputs cast to half, a model placed on a device, a dtype variable for autocast
        "x = x.half()\nmodel.to(device)\nptdtype = torch.float16\n",
        # a cast undone at once (yolov5 rounds its anchors through fp16)
        "model = Model()\nmodel.half().float()\n",
        # a loss weighted by a factor that is no loss scale
        "for x in loader:\n    (loss * weight).backward()\n",
        # `amp.initialize` of something that is not apex
        "import mylib.amp as amp\namp.initialize()\n",
        # an optimizer's step casting fp16 parameters back to what they were (rtdl's RAdam)
        "class RAdam(torch.optim.Optimizer):\n    def step(self):\n"
        "        for p in params:\n            if half:\n                p.data = p.data.half()\n",
    ],
)
def test_stays_silent_without_one(code: str) -> None:
    assert found(code) is None
