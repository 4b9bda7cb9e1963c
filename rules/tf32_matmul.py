"""AO602: fp32 matmuls on CUDA without TF32."""

from __future__ import annotations

import ast

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.device import GPU_MARKERS
from autoopt.lint.program.handled import library_handles_precision
from autoopt.lint.program.index import parse_tree
from autoopt.lint.program.torch_api import torch_imports
from autoopt.lint.tree.edits import insert_after_imports, statement_line

# Any of these in the file means precision was chosen on purpose (either way).
_CHOSEN = ("set_float32_matmul_precision", "allow_tf32", "fp32_precision")


def _chooses_precision(text: str) -> bool:
    return any(flag in text for flag in _CHOSEN)


def _trains_under_autocast(text: str) -> bool:
    """A module of the project that trains under autocast whatever its flags say (the trainer a
    driver hands its model to runs `with autocast():` outside any `if`, without `enabled=`):
    its precision is chosen. Autocast behind a switch (`if use_amp:`, `enabled=self.fp16`)
    leaves the default run in fp32, where TF32 still pays."""
    if "autocast(" not in text or (".backward(" not in text and "zero_grad(" not in text):
        return False
    tree = parse_tree(text)
    return tree is not None and _unconditional_autocast(tree.body)


def _unconditional_autocast(body: list[ast.stmt]) -> bool:
    for stmt in body:
        if isinstance(stmt, ast.With | ast.AsyncWith) and any(
            _always_autocast(item.context_expr) for item in stmt.items
        ):
            return True
        if isinstance(stmt, ast.If | ast.Match):
            continue  # a branch: taken on some runs only
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and _unconditional_autocast(inner):
                return True
    return False


def _always_autocast(expr: ast.expr) -> bool:
    if not isinstance(expr, ast.Call):
        return False
    func = expr.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    enabled = next((k.value for k in expr.keywords if k.arg == "enabled"), None)
    return name == "autocast" and (
        enabled is None or (isinstance(enabled, ast.Constant) and enabled.value is True)
    )


class TF32Matmul(Rule):
    """
    ## What it does
    Flags a training script with a CUDA path that never enables TF32 for float32 matmuls
    (`torch.set_float32_matmul_precision("high")` or
    `torch.backends.cuda.matmul.allow_tf32 = True`).

    ## Why is this bad?
    Since torch 1.12 float32 matmuls on CUDA run in full fp32 by default. On Ampere and newer
    GPUs the tensor cores multiply TF32 (fp32 range, 10-bit mantissa) up to 8x faster (156 vs 19.5
    TFLOPS on an A100); torch prints a warning suggesting this line the first time `torch.compile`
    sees such a matmul. Linear layers, attention and the backward pass of an fp32 model gain most.

    ## Example
    `device = "cuda"; model = Net().to(device)` with no precision setting.

    ## Use instead
    `torch.set_float32_matmul_precision("high")` once, after the imports.

    ## Fix safety
    Unsafe: matmul inputs are rounded to a 10-bit mantissa, so results differ from fp32 by
    about 1e-3 relative; training converges alike in practice, but the numbers change.

    ## When not to
    - Determinism is requested (`cudnn.deterministic = True`,
      `use_deterministic_algorithms(True)`): such scripts usually want bit-exact fp32 numerics.
    - The script already uses `autocast`, or the project's trainer it imports trains under
      it: its forward matmuls run in fp16/bf16, TF32 touches only the few fp32 ones left. Not
      flagged.
    - The file sets any of the precision flags, either way, or a module of the project it
      imports does (the setup code a driver calls). Not flagged.
    - A module with only definitions that another module of the project imports (a trainer
      class): the switch belongs to the script that starts the program. Not flagged there.
    - A library owns the precision: an Accelerate `Accelerator` (`mixed_precision`, also from
      the launch config), Lightning's `precision=`, transformers' `TrainingArguments`
      (`--fp16`/`--bf16`/`--tf32` on the command line). Not flagged.
    - GPUs before Ampere ignore the setting; it does no harm there.
    """

    code = "AO602"
    name = "tf32-matmul"
    message = 'fp32 matmuls on CUDA without TF32; call torch.set_float32_matmul_precision("high")'
    fix_safety = FixSafety.UNSAFE
    fix_reason = "matmuls round their inputs to TF32 (10-bit mantissa): results change ~1e-3"
    covered_by_optimize = True  # the backends pass sets it on Ampere+
    # any word of a device: the program model decides (a driver whose trainer module, or whose
    # config, says "cuda")
    requires = (GPU_MARKERS, ".backward(")

    VALID = [
        Valid(  # a device named, but the CPU
            """
            import torch
            device = torch.device("cpu")
            model = Net().to(device)
            for x in loader:
                model(x.to(device)).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            torch.set_float32_matmul_precision("high")
            model = Net().cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # determinism requested
            """
            import torch
            torch.use_deterministic_algorithms(True)
            model = Net().cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # mixed precision already
            """
            import torch
            model = Net().cuda()
            for x in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x.cuda()).sum()
                loss.backward()
            """
        ),
        Valid(  # the HF Trainer's flags choose the precision (--fp16, --bf16, --tf32)
            """
            import torch
            from transformers import HfArgumentParser, TrainingArguments
            args = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()[0]
            model = Net().cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # Accelerate's mixed_precision (an argument or the launch config)
            """
            import torch
            from accelerate import Accelerator
            accelerator = Accelerator(mixed_precision=args.mixed_precision)
            model = Net().cuda()
            for x in loader:
                accelerator.backward(model(x.cuda()).sum())
            """
        ),
        Valid(  # no training loop: a library module
            """
            import torch
            def to_gpu(model):
                return model.cuda()
            def step(loss):
                loss.backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # `import torch` below a function: the line goes after it, not above it
            """
            import argparse
            def parse():
                return argparse.ArgumentParser().parse_args()
            import torch
            import torchvision
            model = torchvision.models.vit_b_16().cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            line=7,
            fixed="""
            import argparse
            def parse():
                return argparse.ArgumentParser().parse_args()
            import torch
            import torchvision
            torch.set_float32_matmul_precision("high")
            model = torchvision.models.vit_b_16().cuda()
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
            line=5,
            fixed="""
            import torch
            torch.set_float32_matmul_precision("high")

            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().to(device)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch import nn
            net = nn.Linear(4, 4).cuda()
            while True:
                net(batch()).sum().backward()
            """,
            line=3,
            fixed="""
            from torch import nn
            import torch

            torch.set_float32_matmul_precision("high")
            net = nn.Linear(4, 4).cuda()
            while True:
                net(batch()).sum().backward()
            """,
            unsafe=True,
        ),
    ]

    def visit_Module(self, node: cst.Module) -> None:
        facts = self.facts
        source = self.context.source
        program = self.context.program
        if (  # the text first, then the program (cheapest first)
            facts.switches_determinism_on
            or "autocast(" in source
            or _chooses_precision(source)
            or not facts.trains
            or not program.runs_on_cuda
            or not program.is_entry_script  # the driver that imports this trainer says it
            or library_handles_precision(self)  # Accelerate's, Lightning's, the HF Trainer's
            or program.reaches_text_that_says(_chooses_precision)  # a setup() it calls
            or program.reaches_text_that_says(_trains_under_autocast)
        ):
            return
        new = statement_line('torch.set_float32_matmul_precision("high")')
        self.report(
            facts.training_points[0],
            fix=Fix(
                replacements=insert_after_imports(node, new, needs=("torch",)),
                description='torch.set_float32_matmul_precision("high") after the imports',
                add_imports=torch_imports(node),
            ),
        )
