"""AO501: `nn.DataParallel` where DistributedDataParallel is the supported, faster path."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Invalid, Rule, Valid
from autoopt.lint.program.device import GPU_MARKERS
from autoopt.lint.program.facts import named_like_evaluation
from autoopt.lint.program.placement import without_placement
from autoopt.lint.program.project_facts import argparse_default
from autoopt.lint.tree.calls import arg
from autoopt.lint.tree.nodes import (
    bound_once_at_top,
    calls_in,
    code_of,
    is_name,
    method_name,
    names_in,
    nodes_of_type,
    string_value,
)

_DATA_PARALLEL = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
)
# The functional form runs the same scatter/replicate/gather on every call.
_DATA_PARALLEL_FUNCTION = (
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
)

# DataParallel subclasses widely vendored into projects (same scatter/replicate/gather).
_DATA_PARALLEL_SUBCLASSES = frozenset({"DataParallelWithCallback"})


class DataParallel(Rule):
    """
    ## What it does
    Flags `torch.nn.DataParallel(model)`, and its functional form
    `nn.parallel.data_parallel(module, input, device_ids)` called in a `forward`, in a script
    that can run on a GPU (see `autoopt.lint.program.device`); also a model built by a class
    or a factory of another module of the project that wraps it in `DataParallel` there
    (`model = InsResNet50()` whose `__init__` does), reported where the script builds it;
    and `DataParallelWithCallback`, Synchronized-BatchNorm-PyTorch's subclass that projects
    vendor as `sync_batchnorm` (the same scatter, replicate and gather), and a project's own
    subclass of `nn.DataParallel` that keeps its scatter, forward and gather (Wave-U-Net's
    `model_utils.DataParallel`, which only adds `__getattr__`).

    ## Why
    `DataParallel` is one process driving all GPUs with threads: every step it scatters the
    batch, replicates the model from GPU 0, and gathers the outputs back on GPU 0, so GPU 0
    runs out of memory first (the imbalance a widely read PyTorch tutorial works around with its `parallel.py`
    criterion) and the Python GIL caps the speed-up. `DistributedDataParallel` runs one process
    per GPU and overlaps the gradient all-reduce with backward; PyTorch's own docs recommend it
    even on a single machine, and it is typically 1.5–2× faster on 4–8 GPUs.

    `autoopt rewrite --wrap` inserts `model, loader, optimizer = autoopt.optimize(model,
    loader, optimizer)`, which wraps the model in DDP (and gives the loader a
    `DistributedSampler`) when the script is launched with `torchrun`.

    ## When not to
    - Single-process scripts that only ever run on one GPU gain nothing from either wrapper:
      a `DataParallel` pinned to one device (`device_ids=[0]`) or a script that makes a single
      GPU visible (`CUDA_VISIBLE_DEVICES="0"`, also from a command-line option whose default
      is one GPU: FedAvg's `args['gpu']`, `default='0'`) is not flagged.
    - Scripts with no GPU path (`DataParallel` is then a no-op) and a user's own `DataParallel`
      class with its own gather (such as a widely read PyTorch tutorial's `DataParallelModel`)
      are not flagged.
    - A `DataParallel` inside a function named for inference or evaluation that trains nothing
      (TransReID's `do_inference`, beside a `do_train` that uses DDP), or around a model
      frozen where it is wrapped (`model.requires_grad_(False)`: a feature extractor for a
      metric): no training is spread over the GPUs there.

    ## Fix
    None inline: moving to DDP changes how the script is launched (`torchrun`), how data is
    sharded and how results are saved; use `autoopt rewrite --wrap` or `autoopt.optimize()`.
    """

    code = "AO501"
    name = "data-parallel"
    message = (
        "nn.DataParallel: use DistributedDataParallel (torchrun), e.g. via autoopt.optimize() "
        "/ `autoopt rewrite --wrap`"
    )
    fix_reason = "moving to DDP changes how the script is launched; use `autoopt rewrite --wrap`"
    # no text trigger: the DataParallel may be in the module of a class the script builds
    requires = (GPU_MARKERS,)

    VALID = [
        Valid(  # one GPU visible by the default of an option declared through an alias (dfdc)
            """
            import argparse, os
            import torch
            parser = argparse.ArgumentParser()
            arg = parser.add_argument
            arg("--gpu", type=str, default="0")
            args = parser.parse_args()
            os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu
            model = torch.nn.DataParallel(Net()).cuda()
            """
        ),
        Valid(  # a frozen feature extractor for a metric (ddpm-torch's FID Inception)
            """
            import torch
            from torch import nn
            def load_model(device_ids):
                model = InceptionV3()
                model.requires_grad_(False)
                return nn.DataParallel(model, device_ids=device_ids).cuda()
            """
        ),
        Valid(  # inference spread over the GPUs, beside a training that uses DDP (TransReID)
            """
            import torch
            from torch import nn
            def do_inference(model, val_loader):
                if torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)
                model.to("cuda")
                model.eval()
                for img in val_loader:
                    with torch.no_grad():
                        feats = model(img.to("cuda"))
            """
        ),
        Valid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model.cuda(), device_ids=[local_rank])
            """
        ),
        Valid(
            """
            import torch
            model = torch.nn.DataParallel(model.cuda(), device_ids=[0])
            """
        ),
        Valid(
            """
            import os
            os.environ["CUDA_VISIBLE_DEVICES"] = "0"
            import torch
            model = torch.nn.DataParallel(model).cuda()
            """
        ),
        Valid(  # one GPU made visible from a one-element list (EEG-Conformer)
            """
            import os
            gpus = [0]
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            import torch
            model = torch.nn.DataParallel(Net(), device_ids=[i for i in range(len(gpus))]).cuda()
            """
        ),
        Valid(  # one GPU made visible by an option's default (FedAvg)
            """
            import argparse, os
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("-g", "--gpu", type=str, default="0")
            def main():
                args = parser.parse_args().__dict__
                os.environ["CUDA_VISIBLE_DEVICES"] = args["gpu"]
                model = torch.nn.DataParallel(Net()).cuda()
            """
        ),
        Valid(
            """
            from parallel import DataParallelModel
            import torch
            model = DataParallelModel(model).cuda()
            """
        ),
        Valid(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            """
        ),
    ]
    INVALID = [
        Invalid(  # "-1" hides every GPU by default: the GPUs are chosen at launch (YOLOv4)
            """
            import argparse, os
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("-g", "--gpu", type=str, default="-1")
            cfg = parser.parse_args()
            os.environ["CUDA_VISIBLE_DEVICES"] = cfg.gpu
            model = torch.nn.DataParallel(Net()).cuda()
            """,
            line=7,
        ),
        Invalid(  # the option's default makes two GPUs visible
            """
            import argparse, os
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("-g", "--gpu", type=str, default="0,1")
            def main():
                args = parser.parse_args().__dict__
                os.environ["CUDA_VISIBLE_DEVICES"] = args["gpu"]
                model = torch.nn.DataParallel(Net()).cuda()
            """,
            line=8,
        ),
        Invalid(  # Synchronized-BatchNorm-PyTorch's DataParallel subclass, vendored (SPADE)
            """
            import torch
            from models.networks.sync_batchnorm import DataParallelWithCallback

            model = Pix2PixModel(opt).cuda()
            model = DataParallelWithCallback(model, device_ids=opt.gpu_ids)
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
            if torch.cuda.device_count() > 1:
                model = nn.DataParallel(model)
            model.to(device)
            """,
            line=5,
        ),
        Invalid(
            """
            from torch.nn.parallel import DataParallel as DP
            model = DP(Net(), device_ids=[0, 1]).cuda()
            """,
            line=2,
            message_contains="autoopt",
        ),
        Invalid(  # the functional form inside forward (pytorch/examples dcgan)
            """
            import torch
            import torch.nn as nn
            class Generator(nn.Module):
                def forward(self, input):
                    if input.is_cuda and self.ngpu > 1:
                        return nn.parallel.data_parallel(self.main, input, range(self.ngpu))
                    return self.main(input)
            netG = Generator(ngpu).to(torch.device("cuda"))
            """,
            line=6,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        functional = self.is_call_to(node, *_DATA_PARALLEL_FUNCTION)
        if not (functional or self.is_call_to(node, *_DATA_PARALLEL) or self._subclass(node)):
            self._check_callee(node)
            return
        ids_position = 2 if functional else 1
        if not self._on_gpus(node, ids_position) or self._single_gpu(node, ids_position):
            return
        if self._in_inference(node) or self._wraps_a_frozen_model(node):
            return
        self.report(node)

    def _wraps_a_frozen_model(self, node: cst.Call) -> bool:
        """The wrapped model is frozen where it is wrapped (`model.requires_grad_(False)`,
        ddpm-torch's Inception for FID): inference spread over the GPUs, no training."""
        wrapped = arg(node, "module", 0)
        if wrapped is None:
            return False
        names = names_in(wrapped.value)
        scope = self.context.facts.enclosing_scope(node)
        return any(
            method_name(c) == "requires_grad_"
            and isinstance(c.func, cst.Attribute)
            and isinstance(c.func.value, cst.Name)  # the whole model, not `model.backbone`
            and c.func.value.value in names
            and c.args
            and is_name(c.args[0].value, "False")
            for c in calls_in(scope)
        )

    def _in_inference(self, node: cst.Call) -> bool:
        """Inside a function named for inference or evaluation that trains nothing
        (TransReID's `do_inference`, beside the `do_train` that uses DDP): no training is
        spread over the GPUs there."""
        scope = self.context.facts.enclosing_scope(node)
        if not isinstance(scope, cst.FunctionDef) or not named_like_evaluation(scope.name.value):
            return False
        return not any(
            self.context.facts.enclosing_scope(b) is scope
            for b in self.context.facts.backward_calls
        )

    def _on_gpus(self, node: cst.Call, ids_position: int) -> bool:
        """The script can run on a GPU, or it hands the wrapper GPU ids in a program that runs on
        CUDA (SPADE's trainer: `device_ids=opt.gpu_ids`, the `.cuda()` in the model's module)."""
        program = self.context.program
        if program.gpu_path:
            return True
        return arg(node, "device_ids", ids_position) is not None and program.runs_on_cuda

    def _subclass(self, node: cst.Call) -> bool:
        """A known subclass of DataParallel, imported from the project
        (`DataParallelWithCallback` of Synchronized-BatchNorm-PyTorch, vendored as the
        `sync_batchnorm` package or a git submodule that a checkout may lack)."""
        return any(
            q.rsplit(".", 1)[-1] in _DATA_PARALLEL_SUBCLASSES
            for q in self.qualified_names(node.func)
        ) or (
            "DataParallel" in code_of(node.func) and self.context.program.thin_data_parallel(node)
        )

    def _check_callee(self, node: cst.Call) -> None:
        """A model built by a class or factory of another module of the project that wraps it
        in DataParallel there (CMC's `InsResNet50(...)`): reported at the call that builds it."""
        if not self.context.program.gpu_path or not self._builds_a_bound_model(node):
            return
        found = self.context.program.data_parallel_in_callee(node)
        if found is None:
            return
        path, line = found
        self.report(
            node,
            f"{code_of(node.func)}() wraps the model in nn.DataParallel ({path}:{line}): use "
            "DistributedDataParallel (torchrun), e.g. via autoopt.optimize() / `autoopt "
            "rewrite --wrap`",
        )

    def _builds_a_bound_model(self, node: cst.Call) -> bool:
        """`model = Net(...)`, also placed on the way (`Net(...).cuda()`)."""
        for anc in self.facts.ancestors(node):
            if isinstance(anc, cst.Assign):
                return without_placement(anc.value) is node
            if not isinstance(anc, cst.Attribute | cst.Call | cst.Arg):
                return False
        return False

    def _single_gpu(self, node: cst.Call, ids_position: int) -> bool:
        """Pinned to one device, or only one GPU made visible by the script itself."""
        ids = arg(node, "device_ids", ids_position)
        if (
            ids is not None
            and isinstance(ids.value, cst.List | cst.Tuple)
            and len(ids.value.elements) <= 1
        ):
            return True
        source = self.context.source
        if "CUDA_VISIBLE_DEVICES" in source:
            for n in _env_assignments(self.context.module):
                value = self._visible_devices(n)
                if isinstance(value, str) and value.strip().isdigit():
                    return True  # one GPU's index ("-1", no GPU, is another matter)
        return False

    def _visible_devices(self, value: cst.BaseExpression) -> object:
        """The string `CUDA_VISIBLE_DEVICES` gets: a literal, or the default of the option it
        is read from (FedAvg's `args['gpu']` of `args = parser.parse_args().__dict__`,
        `--gpu` with `default='0'`)."""
        if isinstance(value, cst.Call) and code_of(value.func) == "str" and len(value.args) == 1:
            value = value.args[0].value
        literal = string_value(value)
        if literal is not None:
            return literal
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value == "join"
            and len(value.args) == 1
        ):
            # `",".join(map(str, gpus))` with `gpus = [0]` at the top (EEG-Conformer)
            joined = value.args[0].value
            if isinstance(joined, cst.Call) and code_of(joined.func) == "map" and joined.args:
                joined = joined.args[-1].value
            listed = _module_list_of(self.context.module, joined)
            return "0" if listed is not None and len(listed) == 1 else None
        if (
            isinstance(value, cst.Subscript)
            and isinstance(value.value, cst.Name)
            and len(value.slice) == 1
            and isinstance(value.slice[0].slice, cst.Index)
            and (key := string_value(value.slice[0].slice.value)) is not None
            and key.isidentifier()
        ):
            value = cst.Attribute(value=value.value, attr=cst.Name(key))
        found = argparse_default(self, value)
        return found[0] if found is not None else None


def _module_list_of(module: cst.Module, expr: cst.BaseExpression) -> list[cst.BaseElement] | None:
    """The elements of the list literal `expr` names, bound once at `module`'s top level."""
    bound = bound_once_at_top(module, expr.value) if isinstance(expr, cst.Name) else None
    return list(bound.elements) if isinstance(bound, cst.List) else None


def _env_assignments(module: cst.Module) -> list[cst.BaseExpression]:
    """Values assigned to `...["CUDA_VISIBLE_DEVICES"]` anywhere in the file."""
    return [
        small.value
        for small in nodes_of_type(module, cst.Assign)
        for t in small.targets
        if isinstance(t.target, cst.Subscript)
        and len(t.target.slice) == 1
        and isinstance(t.target.slice[0].slice, cst.Index)
        and string_value(t.target.slice[0].slice.value) == "CUDA_VISIBLE_DEVICES"
    ]
