"""Where a script trains: can it run on a GPU at all, and how it moves its batches there.

One notion shared by every rule about a CUDA trick (pinned memory, non-blocking copies, cuDNN,
channels_last, DataParallel): a script has a *GPU path* when any of these is in its code (not in
comments or docstrings):

- CUDA by name: `torch.cuda.*`, `.cuda()`, a "cuda"/"cuda:0" string, a legacy
  `cuda = torch.cuda.is_available()` flag or `torch.cuda.FloatTensor`;
- the device-generic API of torch >= 2.6: `torch.accelerator.current_accelerator()`,
  `torch.accelerator.is_available()`; an "mps"/"xpu" device string;
- a device chosen outside the file: a `--device`/`--gpu`/`--cuda`/`--no-accel` command-line
  flag, or a function that takes its `device` as a parameter (`train(model, device, loader)`),
  unless the file itself binds `device` to the CPU only;
- a Lightning `Trainer(gpus=N)` / `Trainer(accelerator="gpu")` (or "cuda", "auto", or one
  chosen at run time): the Trainer places model and batches on the GPUs.

A CPU-only tutorial (no device at all, or `device = "cpu"`) has no GPU path. A file that reads
a device of unknown origin (`.to(self.device)`, the attribute set by a base class of another
module) is on a GPU path when the program it belongs to runs on CUDA: the view's `gpu_path`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from autoopt.lint.tree.nodes import code_of, dotted, nodes_of_type, string_value

Parent = Callable[[cst.CSTNode], "cst.CSTNode | None"]

# Pre-filter text for rules about GPU tricks: a file with a GPU path contains one of these.
GPU_MARKERS = ("cuda", "accelerator", "device", "gpu", "mps", "xpu", ".dev()")

_GPU_NAMES = frozenset({"cuda", "accelerator"})  # `torch.cuda`, `x.cuda()`, `torch.accelerator`
_GPU_STRING = re.compile(r"^(cuda|mps|xpu)(:\d+)?$")
_DEVICE_FLAG = re.compile(r"^--?(no[-_])?(device|devices|gpus?|gpu[-_]ids?|cuda|accel\w*)$")
_DEVICE_PARAMS = frozenset({"device", "dev"})
# The legacy typed-tensor idiom: `imgs.type(torch.cuda.FloatTensor)` / `Variable(x.type(Tensor))`.
_CUDA_TENSOR_TYPE = re.compile(r"^torch\.cuda\.\w+Tensor$")


@dataclass(frozen=True)
class DeviceFacts:
    """What the file says about its device. `why` names the first GPU evidence found."""

    gpu_path: bool
    why: str
    tensor_type_names: frozenset[str]  # names bound to `torch.cuda.XTensor` (legacy `Tensor`)
    # No GPU path and no device of unknown origin: nothing but the CPU (`device = "cpu"`, or no
    # device at all); `cpu_only()` adds what the text says (distributed launchers, GPU words).
    no_device: bool = False


_READ_KINDS = (
    cst.Name,
    cst.Attribute,
    cst.SimpleString,
    cst.FormattedString,
    cst.Param,
    cst.Assign,
)


def _run_time_device(value: cst.BaseExpression) -> bool:
    """`torch.device(config["device"])`: a device read from a config or the caller, not a
    literal (DDPM's `modelConfig["device"]`, "cuda:0" in the driver); also that setting as it
    is (denoiser's `self.device = args.device`)."""
    if isinstance(value, cst.Attribute):
        return value.attr.value == "device"
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        index = value.slice[0].slice
        key = string_value(index.value) if isinstance(index, cst.Index) else None
        return key == "device"
    return (
        isinstance(value, cst.Call)
        and (dotted(value.func) or "").rsplit(".", 1)[-1] == "device"
        and bool(value.args)
        and isinstance(value.args[0].value, cst.Subscript | cst.Attribute)
    )


def _called_bare(parent: Parent, node: cst.CSTNode) -> bool:
    """`node()`: called with no arguments."""
    call = parent(node)
    return isinstance(call, cst.Call) and call.func is node and not call.args


def device_facts(module: cst.Module, parent: Parent) -> DeviceFacts:
    """The device facts of `module` (computed once per file through `FileFacts.device`);
    `parent` maps a node to its parent."""
    why = ""
    params = False
    cpu_only_binding = None  # True while every `device = ...` seen is a CPU literal
    tensor_types: set[str] = set()
    device_named = False  # a `device`/`dev` name read anywhere (it may come from elsewhere)
    # only the classes read below (about a third of a tree's nodes), in source order
    for node in nodes_of_type(module, _READ_KINDS):
        kind = type(node)  # exact types: see nodes.py
        if kind is cst.Name and node.value in _DEVICE_PARAMS:
            device_named = True
        if kind is cst.Attribute and node.attr.value in _GPU_NAMES:
            why = why or f"`.{node.attr.value}`"
        elif kind is cst.Attribute and node.attr.value == "dev" and _called_bare(parent, node):
            # guided-diffusion's `dist_util.dev()`: the device a helper of the project picks
            why = why or f"`{code_of(node)}()`"
        elif kind is cst.Name and node.value in _GPU_NAMES and _is_code_name(parent, node):
            why = why or f"`{node.value}`"
        elif kind is cst.SimpleString:
            text = string_value(node)
            if text is not None and _GPU_STRING.match(text):
                why = why or f'"{text}" device'
            elif text is not None and _DEVICE_FLAG.match(text):
                why = why or f"a `{text}` flag"
        elif kind is cst.FormattedString and node.parts:
            first = node.parts[0]
            if isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda"):
                why = why or "an f-string cuda device"
        elif kind is cst.Param and node.name.value in _DEVICE_PARAMS:
            params = True
        elif kind is cst.Assign:
            for target in node.targets:
                name = dotted(target.target)
                if name in _DEVICE_PARAMS or (name or "").endswith(".device"):
                    cpu = _is_cpu(node.value)
                    cpu_only_binding = cpu if cpu_only_binding is None else cpu_only_binding and cpu
                    if _run_time_device(node.value):
                        why = why or "a device chosen at run time"
                if isinstance(target.target, cst.Name) and _is_cuda_tensor_type(node.value):
                    tensor_types.add(target.target.value)
    if not why and params and not cpu_only_binding:
        why = "a device passed in by the caller"
    if not why and not cpu_only_binding and _imported_config_device(module):
        why = "a device from an imported config"
    if not why and _lightning_on_gpus(module):
        why = "a Lightning Trainer on GPUs"
    no_device = not why and (not device_named or cpu_only_binding is True)
    return DeviceFacts(bool(why), why, frozenset(tensor_types), no_device)


_LIGHTNING = ("lightning", "pytorch_lightning")
_GPU_ACCELERATORS = frozenset({"gpu", "cuda", "auto"})


def _lightning_on_gpus(module: cst.Module) -> bool:
    """A Lightning `Trainer(...)` told to use GPUs: `gpus=` anything but 0/None (byol's
    `gpus=NUM_GPUS`, AdaFace's `gpus=hparams.gpus`), or `accelerator="gpu"`/"cuda"/"auto"
    or one chosen at run time; the Trainer places model and batches there."""
    imports = any(
        (dotted(n.module) if isinstance(n, cst.ImportFrom) and n.module else "").split(".")[0]
        in _LIGHTNING
        or (
            isinstance(n, cst.Import)
            and any(dotted(a.name).split(".")[0] in _LIGHTNING for a in n.names)
        )
        for n in nodes_of_type(module, (cst.Import, cst.ImportFrom))
    )
    if not imports:
        return False
    for call in nodes_of_type(module, cst.Call):
        if (dotted(call.func) or "").rsplit(".", 1)[-1] != "Trainer":
            continue
        for a in call.args:
            key = a.keyword.value if a.keyword is not None else None
            value = a.value
            if key == "gpus" and not (code_of(value) in ("0", "None", "[]") or _is_cpu(value)):
                return True
            if key == "accelerator":
                text = string_value(value)
                if text is None or text in _GPU_ACCELERATORS:
                    return True
    return False


def _imported_config_device(module: cst.Module) -> bool:
    """`from config import opt` and then `opt.device` read: a device chosen in a config module
    (pytorch-book's `opt.device = t.device('cuda') if opt.use_gpu else ...`)."""
    imported = {
        (alias.asname.name if alias.asname else alias.name).value  # type: ignore[union-attr]
        for stmt in module.body
        if isinstance(stmt, cst.SimpleStatementLine)
        for small in stmt.body
        if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar)
        for alias in small.names
        if isinstance(alias.asname.name if alias.asname else alias.name, cst.Name)
    }
    return bool(imported) and any(
        isinstance(node.value, cst.Name) and node.value.value in imported
        for node in nodes_of_type(module, cst.Attribute)
        if node.attr.value == "device"
    )


# Text of a script that runs where a launcher or a library puts it (detectron2's `launch`,
# DistributedDataParallel with `device_ids`): not a CPU-only script even with no device in it.
_PLACED_ELSEWHERE = re.compile(r"gpu|distributed|dataparallel|device_ids|nccl|cuda", re.IGNORECASE)


def cpu_only(device: DeviceFacts, source: str) -> bool:
    """The script trains on the CPU and nowhere else: no GPU path, no device bound anywhere
    but to the CPU, and no word of GPUs or distributed launchers in its text. CUDA-only advice
    (mixed precision with a GradScaler) does not apply to it."""
    return device.no_device and not _PLACED_ELSEWHERE.search(source)


def _is_code_name(parent: Parent, node: cst.Name) -> bool:
    """A name in code, not the keyword of an argument (`Trainer(accelerator="cpu")`)."""
    holder = parent(node)
    return not (isinstance(holder, cst.Arg) and holder.keyword is node)


def _is_cpu(expr: cst.BaseExpression) -> bool:
    """`"cpu"` or `torch.device("cpu")`."""
    if isinstance(expr, cst.Call) and expr.args:
        expr = expr.args[0].value
    text = string_value(expr)
    return text is not None and text.startswith("cpu")


def _is_cuda_tensor_type(expr: cst.BaseExpression) -> bool:
    """`torch.cuda.FloatTensor`, or `torch.cuda.FloatTensor if cuda else torch.FloatTensor`."""
    if isinstance(expr, cst.IfExp):
        return _is_cuda_tensor_type(expr.body) or _is_cuda_tensor_type(expr.orelse)
    return bool(_CUDA_TENSOR_TYPE.match(dotted(expr) or ""))


def is_cuda_tensor_type(device: DeviceFacts, expr: cst.BaseExpression) -> bool:
    """`expr` names a CUDA tensor type: `torch.cuda.FloatTensor` or a name bound to one (the
    legacy `Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor`)."""
    if isinstance(expr, cst.Name) and expr.value in device.tensor_type_names:
        return True
    return _is_cuda_tensor_type(expr)
