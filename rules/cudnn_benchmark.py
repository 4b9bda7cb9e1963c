"""AO601: a convolutional network on CUDA without `torch.backends.cudnn.benchmark = True`."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import libcst as cst

from autoopt.lint.engine.rule import FileContext, Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.conv_models import builds_convolution
from autoopt.lint.program.device import GPU_MARKERS
from autoopt.lint.program.project_facts import argparse_default, definition_at
from autoopt.lint.program.project_text import text_uses_cuda
from autoopt.lint.program.torch_api import torch_imports
from autoopt.lint.tree.edits import insert_after_imports, statement_line
from autoopt.lint.tree.nodes import calls_in, code_of, is_name, is_true, nodes_of_type

_BENCHMARK = "torch.backends.cudnn.benchmark"


# (not in a comment: Wave-U-Net's `#torch.backends.cudnn.benchmark=True`)
_TURNS_BENCHMARK_ON = re.compile(r"^[^#\n]*cudnn\.benchmark\s*=\s*True\b", re.MULTILINE)


def _sets_benchmark(text: str) -> bool:
    """The text turns cuDNN's autotuning on (a seed helper that turns it off when asked for
    determinism leaves the default run without it: still told)."""
    return _TURNS_BENCHMARK_ON.search(text) is not None


# `cudnn.benchmark = ...` either way, or `cudnn.deterministic = True`: a driver's own choice.
_SETTING = re.compile(
    r"^(\s*)(torch\.backends\.)?cudnn\.(benchmark\s*=|deterministic\s*=\s*True\b)"
)


def _chooses_benchmark(text: str) -> bool:
    """The text sets cuDNN's autotuning either way, or asks for determinism, at its top level,
    where every run passes (SCINet's run_ETTh.py: `cudnn.benchmark = False`,
    `cudnn.deterministic = True`, then the Exp module's convolutions); not in a function (a
    seed helper may run only when a seed is given) nor under an `if`."""
    return any(
        found is not None and not found.group(1) for found in map(_SETTING.match, text.splitlines())
    )


_DETERMINISTIC = "torch.backends.cudnn.deterministic"
_USE_DETERMINISTIC = "torch.use_deterministic_algorithms"


class CudnnBenchmark(Rule):
    """
    ## What it does
    Flags a script that builds convolution layers (`nn.Conv1d/2d/3d`, transposed convolutions,
    `F.conv2d`), a convolutional model from a zoo (`torchvision.models.resnet50()`,
    `models.__dict__[arch]()`, `timm.create_model("resnet50d")`) or one defined in another
    module of the project (`from models import Net`, read without importing it) and can run on
    a GPU (CUDA, `torch.accelerator`, a device flag; see `autoopt.lint.program.device`), but never
    sets `torch.backends.cudnn.benchmark`.

    ## Why
    With `benchmark = True`, cuDNN times its candidate algorithms for each new input shape the
    first time it sees it and keeps the fastest; with fixed input shapes every later step uses
    that choice (as widely read PyTorch tutorials teach). On typical CNN training this is a 10–30% faster
    convolution path for a one-off cost of a few hundred milliseconds per shape.

    ## When not to
    - Determinism is requested (`cudnn.deterministic = True`,
      `torch.use_deterministic_algorithms(True)`): benchmarking may pick a different algorithm
      per run, so the rule stays quiet (AO802 reports scripts that set both). Determinism
      asked for only in one `if` (`if args.seed is not None: cudnn.deterministic = True;
      cudnn.benchmark = False`, with no `else`) leaves the default run with neither: that is
      flagged, and the fix sets the flag in a new `else:` of that `if`; unless that `if` holds
      with the command line's defaults (`if opt.IsDeter:` with `default=True`, `if
      configs.seed is not None:` with a default seed). The `if __name__ == "__main__":` block
      is no such `if`: every run passes it.
    - The script has no GPU path (cuDNN is not used on CPU), or the program switches cuDNN off
      (`torch.backends.cudnn.enabled = False` in the script, a script importing it, or a
      module it imports: crnn-pytorch's evaluate.py): not flagged.
    - The script already sets the flag, either way (`benchmark = False` is a choice), outside
      such a determinism branch; or the driver that imports this module does at its top level
      (SCINet's run_ETTh.py sets `benchmark = False` and `deterministic = True` before its Exp
      module's convolutions run; a seed helper's settings do not count); or a helper of the
      project that the script calls, not under an `if`, asks for determinism whenever it runs
      (AGCRN's `init_seed(args.seed)` setting `cudnn.deterministic = True`, also under an
      `if` on a parameter defaulting to True: PointPillars' `setup_seed(deterministic=True)`;
      a call in the `if __name__ == "__main__":` block counts, as every run passes it).
    - A library module that only defines layers (no training loop, no `__main__` block) is not
      flagged: setting a global flag at import would surprise its importers.
    - Input shapes that change every step (variable-length sequences for `Conv1d`, multi-scale
      training) make cuDNN re-benchmark each new shape; there the flag can cost time. Suppress
      with `# noqa: AO601` in such scripts.

    ## Fix (safe)
    Adds `torch.backends.cudnn.benchmark = True` right after the import header (or in the
    `else:` of the determinism branch), adding `import torch` if the file lacks it. Only the choice of convolution algorithm changes;
    results agree to floating-point tolerance.
    """

    code = "AO601"
    name = "cudnn-benchmark"
    message = "convolutions on CUDA without torch.backends.cudnn.benchmark = True"
    fix_safety = FixSafety.SAFE
    fix_reason = "only cuDNN's choice of algorithm changes; results agree within tolerance"
    covered_by_optimize = True  # autoopt.optimize() applies it at run time
    triggers = ("Conv", "conv", "models", "create_model", "from ")  # `from models import Net`
    requires = (GPU_MARKERS, (".backward(", "__main__"))

    VALID = [
        Valid(  # a seed given by default asks for determinism (SFA3D's --seed 2020)
            """
            import argparse
            import torch
            import torchvision.models as models
            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int, default=2020)
            configs = parser.parse_args()
            if configs.seed is not None:
                torch.manual_seed(configs.seed)
                torch.backends.cudnn.deterministic = True
                torch.backends.cudnn.benchmark = False
            model = models.resnet18().cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """
        ),
        Valid(  # set in the main block, which every run passes (SPT_LSA_ViT)
            """
            import torch
            import torchvision.models as models
            def main():
                model = models.resnet18().cuda()
                for x, y in loader:
                    loss_fn(model(x.cuda()), y.cuda()).backward()
            if __name__ == "__main__":
                torch.backends.cudnn.benchmark = False
                torch.backends.cudnn.deterministic = True
                main()
            """
        ),
        Valid(  # determinism under a flag that is on by default (memae's --IsDeter)
            """
            import argparse
            import torch
            import torchvision.models as models
            parser = argparse.ArgumentParser()
            parser.add_argument("--IsDeter", type=bool, default=True)
            opt = parser.parse_args()
            if opt.IsDeter:
                torch.backends.cudnn.benchmark = False
                torch.backends.cudnn.deterministic = True
            model = models.resnet18().cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            torch.backends.cudnn.benchmark = True
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            torch.backends.cudnn.deterministic = True
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
            """
        ),
        Valid(
            """
            import torch
            from torch import nn
            class Block(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
                def to_gpu(self):
                    return self.cuda()
            """
        ),
        Valid(  # a transformer from timm
            """
            import timm
            import torch
            model = timm.create_model("vit_base_patch16_224").cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """
        ),
        Valid(
            """
            import torch
            def Conv2d(*a):
                return None
            model = Conv2d(3, 8, 3)
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
        Valid(  # benchmark turned off outside the determinism branch: the author's choice
            """
            import torch
            import torch.backends.cudnn as cudnn
            from torch import nn
            if seed:
                cudnn.deterministic = True
            cudnn.benchmark = False
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                model(x.cuda()).sum().backward()
            """
        ),
    ]
    INVALID = [
        Invalid(  # the setting left in a comment (Wave-U-Net): not set
            """
            import torch
            import torchvision.models as models
            # torch.backends.cudnn.benchmark = True
            model = models.resnet18().cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
            line=4,
            fixed="""
            import torch
            import torchvision.models as models
            torch.backends.cudnn.benchmark = True
            # torch.backends.cudnn.benchmark = True
            model = models.resnet18().cuda()
            for x, y in loader:
                loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
        ),
        Invalid(  # determinism only under --seed; the default run never sets it (imagenet)
            """
            import torch
            import torch.backends.cudnn as cudnn
            import torchvision.models as models
            def main(args):
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                    cudnn.deterministic = True
                    cudnn.benchmark = False
                model = models.resnet18().cuda()
                for x, y in loader:
                    loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
            line=9,
            fixed="""
            import torch
            import torch.backends.cudnn as cudnn
            import torchvision.models as models
            def main(args):
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                    cudnn.deterministic = True
                    cudnn.benchmark = False
                else:
                    torch.backends.cudnn.benchmark = True
                model = models.resnet18().cuda()
                for x, y in loader:
                    loss_fn(model(x.cuda()), y.cuda()).backward()
            """,
        ),
        Invalid(  # a timm CNN on the torch.accelerator device
            """
            import timm
            import torch
            device = torch.accelerator.current_accelerator()
            model = timm.create_model("resnet50d", pretrained=True).to(device)
            for x, y in loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
            """,
            line=4,
            fixed="""
            import timm
            import torch
            torch.backends.cudnn.benchmark = True
            device = torch.accelerator.current_accelerator()
            model = timm.create_model("resnet50d", pretrained=True).to(device)
            for x, y in loader:
                loss_fn(model(x.to(device)), y.to(device)).backward()
            """,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn

            device = torch.device("cuda")
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).to(device)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
            line=5,
            fixed="""
            import torch
            import torch.nn as nn
            torch.backends.cudnn.benchmark = True

            device = torch.device("cuda")
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).to(device)
            for x in loader:
                model(x.to(device)).sum().backward()
            """,
        ),
        Invalid(
            '''
            """Train a small CNN."""
            from torch import nn

            if __name__ == "__main__":
                net = nn.Conv2d(1, 4, 5).cuda()
            ''',
            line=5,
            fixed='''
            """Train a small CNN."""
            from torch import nn
            import torch

            torch.backends.cudnn.benchmark = True

            if __name__ == "__main__":
                net = nn.Conv2d(1, 4, 5).cuda()
            ''',
        ),
    ]

    def __init__(self, context: FileContext) -> None:
        super().__init__(context)
        self._done = False
        source = self.context.source
        facts = self.context.facts
        # the `if` that alone asks for determinism (and may turn benchmarking off)
        self._determinism_branch: cst.If | None = None
        self._eligible = (
            "cudnn.flags(" not in source
            and context.program.gpu_path
            # a script: it trains or has a main block (never a library's import side effect);
            # a driver whose loop is in another module (`engine.train(model, ...)`) counts
            and (
                "__main__" in source
                or bool(facts.training_loops)
                or (bool(facts.training_calls) and context.program.is_entry_script)
            )
        )
        self._has_settings = "cudnn.benchmark" in source or facts.requests_determinism

    def visit_Module(self, node: cst.Module) -> None:
        # names resolve through the imports only once the visit starts
        if self._eligible and self._has_settings and self._settings:
            # (the text may name the flag only in a comment: Wave-U-Net's
            # `#torch.backends.cudnn.benchmark=True`)
            self._determinism_branch = self._only_determinism_branch()
            self._eligible = self._determinism_branch is not None
        if self._eligible and self._seeded_deterministic():
            self._eligible = False
        if self._eligible and self.context.program.cudnn_off:
            self._eligible = False  # cuDNN is not used at all: nothing to benchmark

    def _seeded_deterministic(self) -> bool:
        """The script calls, not under an `if`, a project helper that asks for determinism
        whenever it runs (AGCRN's `init_seed(args.seed)` setting `cudnn.deterministic =
        True`): determinism is requested, as if the script set it."""
        program = self.context.program
        if not program.reaches_text_that_says(lambda text: "deterministic" in text):
            return False  # no module the script reaches asks for it: no call worth resolving
        return any(
            not self._under_a_condition(call) and program.determinism_in_callee(call) is not None
            for call in calls_in(self.context.module)
        )

    def _under_a_condition(self, node: cst.CSTNode) -> bool:
        """`node` runs only under an `if` of its function or of the module's code; the
        `if __name__ == "__main__":` block is none (every run passes it: Gus-Lab's
        `seed_all(args.seed)` there)."""
        for anc in self.context.facts.ancestors(node):
            if isinstance(anc, cst.FunctionDef):
                return False
            if isinstance(anc, cst.If) and "__main__" not in code_of(anc.test):
                return True
        return False

    def _only_determinism_branch(self) -> cst.If | None:
        """The `if` (without `else`) whose body holds every setting of `cudnn.benchmark`,
        `cudnn.deterministic` and `use_deterministic_algorithms` in the file, one of them a
        request for determinism; None if there is no such `if`."""
        settings = self._settings
        requests = any(
            self.refers_to(t.target, _DETERMINISTIC) and is_true(n.value)
            for n in settings
            if isinstance(n, cst.Assign)
            for t in n.targets
        ) or any(
            bool(n.args) and is_true(n.args[0].value) for n in settings if isinstance(n, cst.Call)
        )
        branches = {id(b): b for b in map(self._branch_of, settings)}
        if not requests or len(branches) != 1:
            return None
        (branch,) = branches.values()
        if branch is not None and self._on_by_default(branch.test):
            return None  # `if opt.IsDeter:` with `default=True` (memae): the default run asks
        return branch

    def _on_by_default(self, test: cst.BaseExpression) -> bool:
        """`test` holds with the command line's defaults: `opt.IsDeter` (`default=True`),
        `args.deterministic` (`default=1`, UA-MT), `configs.seed is not None` (`default=2020`,
        SFA3D)."""
        if (
            isinstance(test, cst.Comparison)
            and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.IsNot | cst.Is)
            and is_name(test.comparisons[0].comparator, "None")
        ):
            found = argparse_default(self, test.left)
            is_none = isinstance(test.comparisons[0].operator, cst.Is)
            return found is not None and (found[0] is None) == is_none
        found = argparse_default(self, test)
        return found is not None and type(found[0]) in (bool, int) and bool(found[0])

    @functools.cached_property
    def _settings(self) -> list[cst.CSTNode]:
        """Every setting of `cudnn.benchmark`, `cudnn.deterministic` and
        `use_deterministic_algorithms` in the file."""
        found: list[cst.CSTNode] = []
        for n in nodes_of_type(self.context.module, (cst.Assign, cst.Call)):
            if isinstance(n, cst.Assign):
                if any(self.refers_to(t.target, _BENCHMARK, _DETERMINISTIC) for t in n.targets):
                    found.append(n)
            elif self.is_call_to(n, _USE_DETERMINISTIC):
                found.append(n)
        return found

    def _branch_of(self, node: cst.CSTNode) -> cst.If | None:
        """The innermost `if` with no `else` whose body holds `node`."""
        facts = self.context.facts
        below: cst.CSTNode = node
        for anc in facts.ancestors(node):
            if isinstance(anc, cst.If) and "__main__" in code_of(anc.test):
                below = anc  # `if __name__ == "__main__":` runs every time (SPT_LSA_ViT)
                continue
            if isinstance(anc, cst.If):
                in_body = below is anc.body
                return anc if in_body and anc.orelse is None else None
            below = anc
        return None

    def _driver_builds_it(self, node: cst.Call) -> bool:
        """A layer of a convolutional model class defined in this trainer module, whose driver
        (a module importing it, the program's entry) builds that class: the driver is told
        there (TextCNN's model.py holds the loop, train.py calls `TextCNN(...)`)."""
        program = self.context.program
        cls = next((a for a in self.facts.ancestors(node) if isinstance(a, cst.ClassDef)), None)
        if cls is None or program.is_entry_script:
            return False
        name = cls.name.value
        found = definition_at(Path(self.context.path), name)
        return (
            found is not None
            and found.conv
            and program.importer_text_says(lambda text: f"{name}(" in text and text_uses_cuda(text))
        )

    def visit_Call(self, node: cst.Call) -> None:
        if self._done or not self._eligible:
            return
        if not builds_convolution(self, node) or self._driver_builds_it(node):
            return
        self._done = True  # one finding per file: the fix is one line for the whole script
        program = self.context.program
        if (
            program.importer_text_says(_sets_benchmark)
            or program.importer_text_says(_chooses_benchmark)
            or program.reaches_text_that_says(_sets_benchmark)
        ):
            # the driver that imports this Solver module sets it, or a setup function of the
            # project the script imports and calls (`initialize(args)`) does
            return
        new = statement_line("torch.backends.cudnn.benchmark = True")
        branch = self._determinism_branch
        if branch is None:
            replacements = insert_after_imports(self.context.module, new, needs=("torch",))
            where = "after the imports"
        else:  # only when determinism is not asked for
            else_ = cst.Else(body=cst.IndentedBlock(body=[new]))
            replacements = {branch: branch.with_changes(orelse=else_)}
            where = "when determinism is not requested"
        self.report(
            node,
            fix=Fix(
                replacements=replacements,
                description=f"set torch.backends.cudnn.benchmark = True {where}",
                add_imports=torch_imports(self.context.module),
            ),
        )
