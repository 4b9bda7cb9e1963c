"""AO607: a convolution's bias computed and then cancelled by the BatchNorm right after it."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.modules import attribute_uses, chained_layers, init_layers, methods
from autoopt.lint.program.torch_api import BATCH_NORMS, CONV_BIAS_POSITION, CONV_LAYERS_WITH_BIAS
from autoopt.lint.tree.calls import arg, with_keyword
from autoopt.lint.tree.nodes import is_true

_SEQUENTIAL = ("torch.nn.Sequential", "torch.nn.modules.container.Sequential")


class ConvBiasBeforeBatchNorm(Rule):
    """
    ## What it does
    Flags `nn.Conv*d` layers with a bias (the default) whose output goes straight into a
    BatchNorm: consecutive layers of an `nn.Sequential(...)`, or `self.bn(self.conv(x))` (also
    as two consecutive statements) in a module's `forward`.

    ## Why is this bad?
    BatchNorm subtracts the per-channel mean of its input, which removes any per-channel
    constant the convolution added: the bias costs a broadcast add forward, a reduction
    backward, and optimizer state, for a gradient that is exactly zero. torchvision's ResNets
    build these convolutions with `bias=False`.

    ## Example
    `nn.Sequential(nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU())`

    ## Use instead
    `nn.Sequential(nn.Conv2d(3, 64, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU())`

    ## Fix safety
    Unsafe: the model's `state_dict` loses the `<conv>.bias` keys, so checkpoints saved before
    no longer load with `strict=True`, and pretrained weights that hold a bias need it folded
    into the BatchNorm's running mean first.

    ## When not to
    - A convolution whose output is used anywhere else (a skip connection, `self.conv.bias`
      read elsewhere): only provable pairs are flagged.
    - `bias=` given as a variable or hidden in `**kwargs`: left alone.
    """

    code = "AO607"
    name = "conv-bias-before-batchnorm"
    message = "convolution bias is cancelled by the BatchNorm that follows it; pass bias=False"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "the state_dict loses the conv's bias keys; old checkpoints stop loading strictly"
    triggers = ("BatchNorm",)
    requires = (("Conv", "conv"),)

    VALID = [
        Valid(
            """
            from torch import nn
            block = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
            """
        ),
        Valid(  # a ReLU between the two: the bias matters
            """
            from torch import nn
            block = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.BatchNorm2d(8))
            """
        ),
        Valid(  # the conv's output is also used by a skip connection
            """
            from torch import nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(8, 8, 3, padding=1)
                    self.bn = nn.BatchNorm2d(8)
                def forward(self, x):
                    h = self.conv(x)
                    return self.bn(h) + h
            """
        ),
        Valid(  # bias hidden in **kwargs; a user's own Conv2d
            """
            from torch import nn
            def Conv2d(*a, **k):
                return nn.Identity()
            a = nn.Sequential(nn.Conv2d(3, 8, 3, **opts), nn.BatchNorm2d(8))
            b = nn.Sequential(Conv2d(3, 8, 3), nn.BatchNorm2d(8))
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch.nn as nn
            features = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1),
                nn.BatchNorm2d(32),
                nn.ReLU(),
            )
            """,
            line=3,
            fixed="""
            import torch.nn as nn
            features = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1, bias=False),
                nn.BatchNorm2d(32),
                nn.ReLU(),
            )
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch import nn
            class Block(nn.Module):
                def __init__(self, c):
                    super().__init__()
                    self.conv = nn.Conv2d(c, c, 3, 1, 1, 1, 1, True)
                    self.bn = nn.BatchNorm2d(c)
                    self.conv2 = nn.Conv2d(c, c, 1)
                    self.bn2 = nn.BatchNorm2d(c)
                def forward(self, x):
                    x = torch.relu(self.bn(self.conv(x)))
                    x = self.conv2(x)
                    x = self.bn2(x)
                    return x
            """,
            line=5,
            fixed="""
            from torch import nn
            class Block(nn.Module):
                def __init__(self, c):
                    super().__init__()
                    self.conv = nn.Conv2d(c, c, 3, 1, 1, 1, 1, False)
                    self.bn = nn.BatchNorm2d(c)
                    self.conv2 = nn.Conv2d(c, c, 1, bias=False)
                    self.bn2 = nn.BatchNorm2d(c)
                def forward(self, x):
                    x = torch.relu(self.bn(self.conv(x)))
                    x = self.conv2(x)
                    x = self.bn2(x)
                    return x
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_SEQUENTIAL):
            return
        layers = [a.value for a in node.args]
        for conv, norm in zip(layers, layers[1:], strict=False):
            if self._biased_conv(conv) and self.is_call_to(norm, *BATCH_NORMS):
                self._report(conv)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        layers = init_layers(node)
        forward = methods(node).get("forward")
        for conv_attr, norm_attr in chained_layers(forward) if forward else ():
            conv, norm = layers.get(conv_attr), layers.get(norm_attr)
            if (
                conv is not None
                and norm is not None
                and self._biased_conv(conv)
                and self.is_call_to(norm, *BATCH_NORMS)
                and attribute_uses(self.context.module, conv_attr) == 2  # built once, called once
            ):
                self._report(conv)

    def _biased_conv(self, expr: cst.BaseExpression) -> bool:
        if not isinstance(expr, cst.Call) or not self.is_call_to(expr, *CONV_LAYERS_WITH_BIAS):
            return False
        if any(a.star for a in expr.args):
            return False
        given = arg(expr, "bias", CONV_BIAS_POSITION)
        return given is None or is_true(given.value)

    def _report(self, conv: cst.Call) -> None:
        given = arg(conv, "bias", CONV_BIAS_POSITION)
        false = cst.Name("False")
        if given is not None and given.keyword is None:
            new = conv.with_changes(
                args=[a.with_changes(value=false) if a is given else a for a in conv.args]
            )
        else:
            new = with_keyword(conv, "bias", false)
        self.report(conv, fix=Fix(replacements={conv: new}, description="bias=False"))
