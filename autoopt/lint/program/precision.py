"""Another mixed-precision system in a script: the one fact every precision trick must check.

A script that already trains in reduced precision its own way must not get torch autocast and a
`GradScaler` on top (two loss scalers, casts fighting casts), nor have `--wrap` hand it to
`autoopt.optimize()` with AMP: NVIDIA apex `amp.initialize`/`amp.scale_loss`, a hand-written
loss scale (fp16 master weights and `loss * loss_scale`), or models and inputs cast to
`.half()`/`.bfloat16()`/`.to(torch.float16)`. (torch's own `autocast`/`GradScaler` and the
libraries that set precision themselves, Accelerate and Lightning, are checked where they are
used: `handled.library_handles_precision`, AO201's own words.)

Plain syntax only (no metadata): rules and the `--wrap` planner both call it on a parsed module.
"""

from __future__ import annotations

import re

import libcst as cst

from autoopt.lint.tree.nodes import code_of, dotted, walk

# Text every file running one of them contains: the cheap pre-filter of the walk below.
_PRECISION_MARKERS = ("apex", ".half()", ".bfloat16()", "float16", ".half)", "scale", "master_")
_HALF_DTYPES = {"torch.float16", "torch.half", "torch.bfloat16"}
_HALF_CASTS = {"half", "bfloat16"}
# keywords of model builders that set the parameters' dtype (transformers, mistral's load_model)
_MODEL_DTYPE_KEYWORDS = {"torch_dtype", "param_dtype"}
# Where a module's own methods show that a receiver is an nn.Module.
_MODULE_METHODS = {"parameters", "named_parameters", "train", "eval", "state_dict", "modules"}
# Loss-scaling / master-weight classes of apex, Megatron and fairseq: fp16 run by hand.
_FP16_CLASSES = ("FP16_Optimizer", "FP16Optimizer", "DynamicLossScaler", "MemoryEfficientFP16")
_MASTER_NAMES = ("master_params", "master_weights", "master_param", "fp32_params")


def other_precision_system(module: cst.Module, source: str | None = None) -> str | None:
    """Why `module` already trains in reduced precision without torch.autocast/GradScaler, or
    None: apex amp (`amp.initialize`, `amp.scale_loss`), a model cast to half or bfloat16
    (`model.half()`, `Net().to(torch.bfloat16)`), fp16 optimizers and loss scalers of apex,
    Megatron or fairseq, or loss scaling and fp32 master weights written by hand
    (`(loss * loss_scale).backward()`, `master_params = ...`).

    One answer for every rule and for `--wrap`: such a script is left to its own scheme (autocast
    stacked on it, or a second loss scaler, is wrong)."""
    text = source if source is not None else module.code
    if not any(marker in text for marker in _PRECISION_MARKERS):
        return None
    modules: set[str] = set()  # receivers the file treats as nn.Modules
    casts: list[tuple[str, str]] = []  # (receiver, cast code)
    undone: set[int] = set()  # `model.half().float()`: cast back at once (yolov5's anchors)
    for node in walk(module):
        kind = type(node)
        if kind is cst.Call:
            func = node.func
            name = dotted(func) or ""
            last = name.rsplit(".", 1)[-1]
            apex = "apex" in text and "amp" in name.split(".")[:-1]
            if apex and last in ("initialize", "scale_loss"):
                return f"apex amp (`{name}`)"
            if last in _FP16_CLASSES:
                return f"an fp16 optimizer/loss scaler (`{last}`)"
            if not isinstance(func, cst.Attribute):
                continue
            receiver = code_of(func.value)
            attr = func.attr.value
            if attr in _MODULE_METHODS and not node.args:
                modules.add(receiver)
            elif attr == "float" and isinstance(func.value, cst.Call):
                undone.add(id(func.value))
            elif attr in _HALF_CASTS and not node.args and id(node) not in undone:
                casts.append((receiver, f"{receiver}.{attr}()"))
            elif attr == "to" and any((dotted(a.value) or "") in _HALF_DTYPES for a in node.args):
                casts.append((receiver, code_of(node)))
            elif attr == "backward" and _scaled_by_hand(func.value):
                return f"hand-written loss scaling (`{code_of(func.value)}.backward()`)"
        elif kind is cst.Assign:
            for target in node.targets:
                name = dotted(target.target) or ""
                if name.rsplit(".", 1)[-1] in _MASTER_NAMES:
                    return f"hand-written fp32 master weights (`{name}`)"
                if isinstance(node.value, cst.Call) and _is_constructor(node.value):
                    modules.add(name)  # `model = Net(...)`: a module when it is cast below
                value = node.value
                if (
                    name.endswith(".data")
                    and isinstance(value, cst.Call)
                    and isinstance(value.func, cst.Attribute)
                    and value.func.attr.value in _HALF_CASTS
                    and not _in_an_optimizer(module, node)
                ):
                    # `m.weight.data = m.weight.data.bfloat16()` (modded-nanogpt's parameters)
                    return f"the model's parameters are cast to reduced precision (`{name} = ...`)"
    for receiver, cast in casts:
        head = receiver.split("(", 1)[0].rsplit(".", 1)[-1]
        if receiver in modules or (receiver.endswith(")") and head[:1].isupper()):
            return f"the model is cast to reduced precision (`{cast}`)"
    return None


def built_in_reduced_precision(module: cst.Module) -> str | None:
    """The model is built in bf16/fp16 by a builder's dtype keyword
    (`load_model(..., param_dtype=param_dtype)` with `param_dtype = torch.bfloat16`: mistral-
    finetune; `from_pretrained(..., torch_dtype=torch.bfloat16)`): what says so, or None. The
    lint's precision rules stand down on it; `--wrap` keeps its own reasons (a model so built
    may still be handed to optimize(), which measures what it runs in)."""
    if "float16" not in module.code:
        return None
    half_names = {  # `param_dtype = torch.bfloat16`
        dotted(t.target)
        for node in walk(module)
        if type(node) is cst.Assign and (dotted(node.value) or "") in _HALF_DTYPES
        for t in node.targets
    }
    for node in walk(module):
        if type(node) is not cst.Call:
            continue
        for a in node.args:
            if a.keyword is not None and a.keyword.value in _MODEL_DTYPE_KEYWORDS:
                value = dotted(a.value) or ""
                if value in _HALF_DTYPES or value in half_names:
                    return f"the model is built in reduced precision (`{a.keyword.value}={value}`)"
    return None


def runs_apex(text: str) -> bool:
    """A module's text initializes apex amp or scales a loss with it, also through a name
    holding apex's module (End-to-end-ASR's `self.amp_lib.initialize(...)` in its base
    class's `enable_apex()`), as far as the text says."""
    return "apex" in text and re.search(r"\bamp\w*\.(initialize|scale_loss)\(", text) is not None


def drives_its_own_precision(text: str) -> bool:
    """A driver's text runs a precision system of its own around the training it hands to
    another module: apex amp, or an fp16 optimizer/loss scaler (HigherHRNet's dist_train.py:
    `FP16_Optimizer` around the optimizer `do_train` of lib/core/trainer.py steps)."""
    return runs_apex(text) or any(re.search(rf"\b{name}\(", text) for name in _FP16_CLASSES)


def fp32_beside_apex(module: cst.Module, source: str | None = None) -> str | None:
    """Why a script that uses apex amp still trains in fp32, or None: `opt_level="O0"`, apex's
    pure fp32 level (FloWaveNet's train_apex.py). Apex only when a flag asks for it (`if
    args.fp16: amp.scale_loss(...) else: loss.backward()`) is the script's own choice of
    precision: not reported (twelve labelled scripts of the corpus, one against)."""
    text = source if source is not None else module.code
    if "apex" not in text:
        return None
    for node in walk(module):
        if not isinstance(node, cst.Call):
            continue
        name = dotted(node.func) or ""
        if name.rsplit(".", 1)[-1] == "initialize" and "amp" in name.split(".")[:-1]:
            for arg in node.args:
                level = arg.value
                if (
                    arg.keyword is not None
                    and arg.keyword.value == "opt_level"
                    and isinstance(level, cst.SimpleString)
                    and level.evaluated_value == "O0"
                ):
                    return 'apex amp at opt_level="O0" (pure fp32)'
    return None


def _in_an_optimizer(module: cst.Module, node: cst.Assign) -> bool:
    """`node` is in an optimizer class or a `step` method: an optimizer's own step casting
    fp16 parameters back (rtdl's RAdam), not the model's cast."""
    return any(
        node in walk(scope)
        for scope in walk(module)
        if (isinstance(scope, cst.ClassDef) and "Optimizer" in code_of(scope).split(":", 1)[0])
        or (isinstance(scope, cst.FunctionDef) and scope.name.value == "step")
    )


def _is_constructor(call: cst.Call) -> bool:
    """`Net(...)`, `models.resnet18(...)`-style calls are not told apart: only a class name."""
    name = dotted(call.func) or ""
    return name.rsplit(".", 1)[-1][:1].isupper()


def _scaled_by_hand(expr: cst.BaseExpression) -> bool:
    """`loss * loss_scale` / `(scale * loss)`: a product with a factor named like a scale."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        expr = expr.func.value  # `(loss * scale).float()`
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Multiply):
        return False
    return any("scale" in code_of(side).lower() for side in (expr.left, expr.right))
