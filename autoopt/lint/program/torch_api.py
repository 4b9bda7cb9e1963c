"""What the lint knows about torch's API: DataLoader's signature, convolution layers and
convolutional model zoos, and how a file spells `torch` (for fixes that write torch code)."""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Rule
from autoopt.lint.tree.nodes import (
    calls_in,
    code_of,
    dotted,
    method_name,
    string_value,
    top_level_imports,
)

DATALOADER = (
    "torch.utils.data.DataLoader",
    "torch.utils.data.dataloader.DataLoader",
    # subclasses that hand their keyword options to torch's: PyG's graph batches, MONAI's
    # (not MONAI's ThreadDataLoader, whose workers are threads)
    "torch_geometric.loader.DataLoader",
    "torch_geometric.loader.dataloader.DataLoader",
    "torch_geometric.data.DataLoader",
    "monai.data.DataLoader",
    "monai.data.dataloader.DataLoader",
)

# DataLoader's positional parameters after `dataset` (torch 1.7 .. 2.x); the later ones
# (prefetch_factor, persistent_workers, ...) are keyword-only.
DATALOADER_POSITIONS: Mapping[str, int] = {
    "batch_size": 1,
    "shuffle": 2,
    "sampler": 3,
    "batch_sampler": 4,
    "num_workers": 5,
    "collate_fn": 6,
    "pin_memory": 7,
    "drop_last": 8,
    "timeout": 9,
    "worker_init_fn": 10,
    "multiprocessing_context": 11,
    "generator": 12,
}


# Layers whose presence makes a model "convolutional" (cuDNN kernels; NHWC-friendly).
CONV_LAYERS = frozenset(
    f"torch.nn.{kind}{dim}d{suffix}"
    for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
    for dim in (1, 2, 3)
    for suffix in ("",)
) | frozenset(
    f"torch.nn.modules.conv.{kind}{dim}d" for kind in ("Conv", "ConvTranspose") for dim in (1, 2, 3)
)
CONV_FUNCTIONS = frozenset(
    f"torch.nn.functional.conv{name}"
    for name in ("1d", "2d", "3d", "_transpose1d", "_transpose2d", "_transpose3d")
)
CONV2D = frozenset(
    {
        "torch.nn.Conv2d",
        "torch.nn.ConvTranspose2d",
        "torch.nn.LazyConv2d",
        "torch.nn.LazyConvTranspose2d",
        "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.conv.ConvTranspose2d",
        "torch.nn.functional.conv2d",
        "torch.nn.functional.conv_transpose2d",
    }
)


def is_conv_call(
    rule: Rule, call: cst.Call, kinds: frozenset[str] = CONV_LAYERS | CONV_FUNCTIONS
) -> bool:
    """A torch convolution layer or functional convolution (of `kinds`)."""
    return bool(rule.qualified_names(call.func) & kinds)


# Families of convolutional networks in torchvision and timm (their model names start with these).
CONV_FAMILIES = (
    "resnet", "resnext", "wide_resnet", "seresnet", "seresnext", "resnest", "regnet", "vgg",
    "densenet", "mobilenet", "efficientnet", "tf_efficientnet", "convnext", "shufflenet",
    "squeezenet", "mnasnet", "googlenet", "inception", "xception", "alexnet", "darknet",
    "cspdarknet", "cspresnet", "dla", "dpn", "hrnet", "ghostnet", "rexnet", "nfnet", "dm_nfnet",
    "res2net", "senet", "fbnet", "lcnet", "mixnet",
)  # fmt: skip


TRANSFORMER_FAMILIES = ("vit", "deit", "swin", "beit", "cait", "eva", "xcit", "pvt", "twins")


def is_transformer_family(model_name: str) -> bool:
    """A timm/torchvision model name of a vision-transformer family ("vit_base_patch16_224"),
    whose only convolution is its patch embedding."""
    return model_name.lower().startswith(TRANSFORMER_FAMILIES)


def is_conv_family(model_name: str) -> bool:
    """A torchvision/timm model name of a convolutional family ("resnet50d", "vgg16_bn")."""
    return model_name.lower().startswith(CONV_FAMILIES)


TIMM_CREATE_MODEL = ("timm.create_model", "timm.models.create_model")


def is_conv_zoo_model(rule: Rule, call: cst.Call) -> bool:
    """A convolutional model from a zoo: `torchvision.models.resnet50()`,
    `models.__dict__[arch]()` (torchvision's ImageNet example: resnet18 by default),
    `torchvision.models.get_model("vgg16")`, `timm.create_model("resnet50d")`."""
    func = call.func
    if isinstance(func, cst.Subscript) and isinstance(func.value, cst.Attribute):
        if func.value.attr.value == "__dict__":
            return "torchvision.models" in rule.qualified_names(func.value.value)
        return False
    for qualified in rule.qualified_names(func):
        if qualified in TIMM_CREATE_MODEL or qualified == "torchvision.models.get_model":
            first = call.args[0] if call.args else None
            text = string_value(first.value) if first is not None and not first.keyword else None
            return text is not None and is_conv_family(text)
        if qualified.startswith("torchvision.models.") and is_conv_family(
            qualified.rsplit(".", 1)[-1]
        ):
            return True
    return False


def _zoo_named(call: cst.Call) -> bool:
    """A cheap test before resolving names: `resnet18(...)`, `create_model(...)`,
    `models.__dict__[arch](...)`."""
    func = call.func
    if isinstance(func, cst.Subscript):
        return True
    leaf = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
    return isinstance(leaf, str) and (leaf in ("create_model", "get_model") or is_conv_family(leaf))


def conv_classes(
    rule: Rule, module: cst.Module, kinds: frozenset[str] = CONV_LAYERS | CONV_FUNCTIONS
) -> dict[str, cst.ClassDef]:
    """Top-level classes of the file built from convolution layers (of `kinds`), directly or
    through other such classes of the file (a `ResNet` made of `Block`s)."""
    classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
    found: dict[str, cst.ClassDef] = {}
    zoo = bool(kinds & CONV2D)  # torchvision/timm CNNs are 2D
    for name, cls in classes.items():
        if any(
            is_conv_call(rule, c, kinds) or (zoo and _zoo_named(c) and is_conv_zoo_model(rule, c))
            for c in calls_in(cls)
        ):  # a conv layer, or a torchvision CNN built inside the class (a backbone)
            found[name] = cls
    aliases = _class_aliases(module)
    changed = True
    while changed:  # close over "uses a conv class" (also under an alias: `Net = AtariNet`)
        changed = False
        for alias, name in aliases.items():
            if alias not in found and name in found:
                found[alias] = found[name]
                changed = True
        for name, cls in classes.items():
            if name in found:
                continue
            if any(isinstance(c.func, cst.Name) and c.func.value in found for c in calls_in(cls)):
                found[name] = cls
                changed = True
    return found


def _class_aliases(module: cst.Module) -> dict[str, str]:
    """`Net = AtariNet` at the module's top level: alias -> name."""
    found = {}
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, cst.Name)
            ):
                found[small.targets[0].target.value] = small.value.value
    return found


def torch_name(rule: Rule) -> tuple[str, tuple[ImportItem, ...]]:
    """How to spell `torch` in this file: its existing alias (`import torch as th` -> "th"),
    else "torch" together with the import to add."""
    for _, alias in top_level_imports(rule.context.module):
        name = code_of(alias.name)
        if alias.asname is None and (name == "torch" or name.startswith("torch.")):
            return "torch", ()  # `import torch.nn` binds `torch` too
        if name == "torch" and alias.asname and isinstance(alias.asname.name, cst.Name):
            return alias.asname.name.value, ()
    return "torch", (ImportItem("torch"),)


def torch_imports(module: cst.Module) -> tuple[ImportItem, ...]:
    """What a fix that writes `torch.x` must import: nothing when the module already has a
    top-level `import torch`, else `import torch` (never emit `torch.` unbound)."""
    if any(
        dotted(alias.name) == "torch" and alias.asname is None
        for _, alias in top_level_imports(module)
    ):
        return ()
    return (ImportItem("torch"),)


# ----- layers, tensors and optimizers the AO5xx-AO9xx rules match ----------------------------
BATCH_NORMS = frozenset(
    {f"torch.nn.BatchNorm{d}d" for d in (1, 2, 3)}
    | {f"torch.nn.modules.batchnorm.BatchNorm{d}d" for d in (1, 2, 3)}
    | {"torch.nn.SyncBatchNorm", "torch.nn.modules.batchnorm.SyncBatchNorm"}
)
# Convolutions whose `bias` is the 8th positional parameter (index 7).
CONV_LAYERS_WITH_BIAS = frozenset(
    name for name in CONV_LAYERS if ".Lazy" not in name and "LazyConv" not in name
)
CONV_BIAS_POSITION = 7

# Factories that take `device=`; `*_like` ones are left out (they copy their input's device).
TENSOR_FACTORIES = frozenset(
    f"torch.{n}"
    for n in ("zeros", "ones", "empty", "full", "eye", "tensor")
    + ("arange", "linspace", "logspace", "rand", "randn", "randint", "randperm")
)
# ... those whose values the device computes: other random numbers, last-bit rounding on CUDA.
DEVICE_COMPUTED_FACTORIES = frozenset(
    f"torch.{n}" for n in ("arange", "linspace", "logspace", "rand", "randn", "randint", "randperm")
)

# Optimizers with a fused step (CUDA since torch 2.0-2.3, CPU since 2.4).
FUSED_OPTIMIZERS = frozenset(
    {f"torch.optim.{n}" for n in ("Adam", "AdamW", "SGD")}
    | {"torch.optim.adam.Adam", "torch.optim.adamw.AdamW", "torch.optim.sgd.SGD"}
)

DDP = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
SOFTMAX = frozenset({"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"})
MATMUL = frozenset({"torch.matmul", "torch.bmm"})
_TRANSPOSES = ("transpose", "permute", "t", "mT", "T")


def uses_amp(rule: Rule) -> bool:
    """The script runs its forward under mixed precision: it opens `autocast`, or hands its
    model to `autoopt.optimize()` without `amp=False` or `amp="script"` (precision left to the
    script, whose own autocast the first test finds)."""
    from autoopt.lint.engine.analysis import calls_autoopt_optimize

    source = rule.context.source
    if "autocast(" in source:
        return True
    return calls_autoopt_optimize(source) and not any(
        off in source for off in ("amp=False", 'amp="script"', "amp='script'")
    )


def functional_name(rule: Rule) -> tuple[str, tuple[ImportItem, ...]]:
    """How to spell `torch.nn.functional` in this file (`F` after `import torch.nn.functional as
    F` or `from torch.nn import functional as F`), else through `torch` with its import."""
    for stmt in rule.context.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                pairs = [(dotted(a.name), a) for a in small.names]
            elif isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                module = None if small.relative else dotted(small.module)
                pairs = [(f"{module}.{dotted(a.name)}", a) for a in small.names]
            else:
                continue
            for name, alias in pairs:
                if name == "torch.nn.functional" and (
                    alias.asname is not None or isinstance(small, cst.ImportFrom)
                ):
                    return alias.evaluated_alias or alias.evaluated_name, ()
    torch, imports = torch_name(rule)
    return f"{torch}.nn.functional", imports


# ----- attention shapes -----------------------------------------------------------------------
def matmul_operands(
    rule: Rule, node: cst.CSTNode | None
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """`a @ b`, `torch.matmul(a, b)`, `torch.bmm(a, b)` -> (a, b)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if isinstance(node, cst.Call) and rule.is_call_to(node, *MATMUL) and len(node.args) == 2:
        return node.args[0].value, node.args[1].value
    return None


def transposed_operand(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`k.transpose(...)`, `k.permute(...)`, `k.t()`, `k.mT`, `k.T` -> `k`."""
    if isinstance(expr, cst.Attribute) and expr.attr.value in _TRANSPOSES:
        return expr.value
    if isinstance(expr, cst.Call) and method_name(expr) in _TRANSPOSES:
        assert isinstance(expr.func, cst.Attribute)
        return expr.func.value
    return None


def swaps_last_two_dims(expr: cst.BaseExpression) -> bool:
    """Swaps exactly the last two dims: `.transpose(-2, -1)`, `.transpose(-1, -2)`, `.mT`."""
    if isinstance(expr, cst.Attribute):
        return expr.attr.value == "mT"
    if isinstance(expr, cst.Call) and method_name(expr) == "transpose" and len(expr.args) == 2:
        return sorted(code_of(a.value) for a in expr.args) == ["-1", "-2"]
    return False


def last_dim_of(expr: cst.BaseExpression, names: set[str]) -> bool:
    """`x.size(-1)` or `x.shape[-1]` with `x` in `names`."""
    text = code_of(expr).replace(" ", "")
    return any(text in (f"{n}.size(-1)", f"{n}.shape[-1]") for n in names)
