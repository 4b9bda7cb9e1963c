"""AO608: a tensor built in host memory and then copied to the device."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.loops import is_dtype, names_device
from autoopt.lint.program.torch_api import DEVICE_COMPUTED_FACTORIES, TENSOR_FACTORIES
from autoopt.lint.tree.calls import arg, with_keyword
from autoopt.lint.tree.nodes import int_literal, is_name, method_name

_TO_OPTIONS = ("device", "dtype", "non_blocking", "copy")  # `.to(...)` in positional order
_TRACERS = ("torch.jit.trace", "torch.jit.script")


# A cast between the factory and the move: the dtype to create the tensor with instead.
_CASTS = {
    "float": "torch.float32",
    "double": "torch.float64",
    "half": "torch.float16",
    "bfloat16": "torch.bfloat16",
    "long": "torch.int64",
    "int": "torch.int32",
    "bool": "torch.bool",
}


class TensorCreatedOnHost(Rule):
    """
    ## What it does
    Flags a tensor factory (`torch.zeros`, `ones`, `empty`, `full`, `eye`, `tensor`, `arange`,
    `linspace`, `rand`, `randn`, `randint`, ...) whose result is moved at once with `.cuda()` or
    `.to(device)`, also after a cast (`torch.ones(n, 1).float().to(device)`: created with
    `dtype=torch.float32` and `device=` instead).

    ## Why is this bad?
    The tensor is filled in host memory, then copied over PCIe and the host copy thrown away: an
    allocation, a fill and a synchronous copy where one kernel on the device would do. In a
    training step (masks, position ids, noise) this adds a host-device round trip every step.

    ## Example
    `mask = torch.ones(n, n).to(device)`

    ## Use instead
    `mask = torch.ones(n, n, device=device)`

    ## Fix safety
    Safe for `zeros`, `ones`, `empty`, `full`, `eye` and `tensor`: the same values, made where
    they are used (`.to(device, dtype)` becomes `device=..., dtype=...`). Unsafe for random and
    computed ranges: `torch.randn(..., device="cuda")` draws from the CUDA generator (other
    numbers for the same seed) and `arange`/`linspace` may round the last bit differently; also
    unsafe with `requires_grad=True`, where the result becomes a leaf that gets a `.grad`, and
    for `.cuda(<expression>)` (`.cuda(self.cuda_index)`): `device=` of an index is the same GPU,
    but where the expression is None `.cuda(None)` meant the current GPU and `device=None` means
    the CPU.

    ## When not to
    - `.to(dtype)`, `.to(other_tensor)`, `.to(memory_format=...)`, `.to("cpu")`, `**kwargs`: not
      a plain move to a device, left alone.
    - A factory with its own `device=`, or a random one with a `generator=` (a CPU generator
      cannot fill a CUDA tensor); code inside `torch.jit.trace(...)`, whose graph records the copy.
    """

    code = "AO608"
    name = "tensor-created-on-host"
    message = "tensor is created on the host and then copied to the device; pass device= instead"
    fix_safety = FixSafety.SAFE
    fix_reason = "the same values, allocated on the device instead of copied there"
    requires = ((").to(", ").cuda("),)  # the factory call ends right before the move

    VALID = [
        Valid(
            """
            import torch
            a = torch.zeros(8, device=device)
            b = torch.zeros(8).to(torch.float16)
            c = torch.zeros(8).to(other)
            d = torch.zeros(8).to(memory_format=torch.channels_last)
            e = torch.zeros(8).to("cpu")
            f = torch.randn(8, generator=g).to(device)
            h = torch.zeros(8, **kw).cuda()
            """
        ),
        Valid(  # traced on purpose: the graph keeps a device node
            """
            import torch
            holder = torch.jit.trace(lambda: torch.ones([]).to(torch.device(device)), example_inputs=[])
            """
        ),
        Valid(  # a user's own `zeros`
            """
            def zeros(n):
                return Buffer(n)
            buf = zeros(8).to(device)
            """
        ),
    ]
    INVALID = [
        Invalid(  # a cast between factory and move (Wav2Lip's `get_sync_loss`)
            """
            import torch
            y = torch.ones(g.size(0), 1).float().to(device)
            labels = torch.zeros(n, dtype=torch.int32).long().cuda()
            """,
            line=2,
            fixed="""
            import torch
            y = torch.ones(g.size(0), 1, device=device, dtype=torch.float32)
            labels = torch.zeros(n, dtype=torch.int64, device="cuda")
            """,
        ),
        Invalid(  # a GPU's index, by name (CMGAN's DDP trainer, a torchrun script)
            """
            import torch
            one_labels = torch.ones(args.batch_size).to(self.gpu_id)
            noise = torch.zeros(8, 3).to(local_rank)
            """,
            line=2,
            fixed="""
            import torch
            one_labels = torch.ones(args.batch_size, device=self.gpu_id)
            noise = torch.zeros(8, 3, device=local_rank)
            """,
        ),
        Invalid(  # a device index the code holds (pytorch-wgan's gradient penalty)
            """
            import torch
            grad_outputs = torch.ones(out.size()).cuda(self.cuda_index)
            """,
            line=2,
            fixed="""
            import torch
            grad_outputs = torch.ones(out.size(), device=self.cuda_index)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            import torch
            mask = torch.ones(n, n, dtype=torch.bool).to(device, non_blocking=True)
            """,
            line=2,
            fixed="""
            import torch
            mask = torch.ones(n, n, dtype=torch.bool, device=device)
            """,
        ),
        Invalid(
            """
            import torch
            ids = torch.tensor(tokens).to(args.device, torch.long)
            pad = torch.zeros(4).cuda()
            """,
            line=2,
            fixed="""
            import torch
            ids = torch.tensor(tokens, device=args.device, dtype=torch.long)
            pad = torch.zeros(4, device="cuda")
            """,
        ),
        Invalid(  # random numbers come from the device's generator: unsafe
            """
            import torch
            from torch import randn
            noise = randn(b, 8).to(device=dev, dtype=torch.half)
            """,
            line=3,
            fixed="""
            import torch
            from torch import randn
            noise = randn(b, 8, device=dev, dtype=torch.half)
            """,
            unsafe=True,
        ),
        Invalid(  # requires_grad=True: the fixed tensor is a leaf with a .grad (unsafe)
            """
            import torch
            w = torch.zeros(3, requires_grad=True).cuda(0)
            """,
            line=2,
            fixed="""
            import torch
            w = torch.zeros(3, requires_grad=True, device="cuda:0")
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        method = method_name(node)
        if method not in ("to", "cuda") or any(a.star for a in node.args):
            return
        assert isinstance(node.func, cst.Attribute)
        factory = node.func.value
        cast = None  # `torch.ones(n, 1).float().to(device)` (Wav2Lip): the dtype it is cast to
        if (
            isinstance(factory, cst.Call)
            and method_name(factory) in _CASTS
            and not factory.args
            and isinstance(factory.func, cst.Attribute)
        ):
            cast = _CASTS[factory.func.attr.value]
            factory = factory.func.value
        if not isinstance(factory, cst.Call) or not self.is_call_to(factory, *TENSOR_FACTORIES):
            return
        if any(a.star == "**" for a in factory.args) or arg(factory, "device") is not None:
            return
        if arg(factory, "generator") is not None:
            return
        if any(self.is_call_to(a, *_TRACERS) for a in self.facts.ancestors(node)):
            return  # a traced graph records the copy on purpose (CLIP's device-node trick)
        options = _cuda_options(node) if method == "cuda" else self._to_options(node)
        # `.cuda(self.cuda_index)`: `device=self.cuda_index` is the same GPU for an index, but
        # the CPU where the expression is None (`.cuda(None)` is the current GPU)
        inexact = method == "cuda" and options is None and _cuda_index_expression(node)
        if inexact:
            options = {"device": arg(node, "device", 0).value}  # type: ignore[union-attr]
        if options is None:
            return
        new = factory
        if cast is not None and "dtype" not in options:
            options = {**options, "dtype": cst.parse_expression(cast)}
        for keyword in ("device", "dtype"):
            if keyword in options:
                new = with_keyword(new, keyword, options[keyword])
        requires_grad = arg(factory, "requires_grad")
        computed = self.is_call_to(factory, *DEVICE_COMPUTED_FACTORIES)
        unsafe = (
            computed
            or inexact
            or not (requires_grad is None or is_name(requires_grad.value, "False"))
        )
        fix = Fix(
            replacements={node: new},
            description="create the tensor with device=",
            safety=FixSafety.UNSAFE if unsafe else None,
        )
        self.report(node, fix=fix)

    def _to_options(self, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
        """`.to(...)`'s device and dtype, when it certainly moves to a device."""
        values: dict[str, cst.BaseExpression] = {}
        for i, a in enumerate(call.args):
            keyword = a.keyword.value if a.keyword else _TO_OPTIONS[i] if i < 4 else "?"
            if keyword not in _TO_OPTIONS:
                return None  # memory_format=, or something unknown
            values[keyword] = a.value
        device = values.get("device")
        if device is None or not names_device(self, device):
            return None  # a dtype cast (`.to(torch.half)`), another tensor, or the CPU
        dtype = values.get("dtype")
        if dtype is not None and not is_dtype(self, dtype):
            return None
        return {k: v for k, v in values.items() if k in ("device", "dtype")}


def _cuda_index_expression(call: cst.Call) -> bool:
    """`.cuda(<name or attribute>)` and nothing else: a device index (or device) the code
    computes."""
    device = arg(call, "device", 0)
    return (
        device is not None
        and len(call.args) == 1
        and isinstance(device.value, cst.Name | cst.Attribute)
        and not is_name(device.value, "None")
    )


def _cuda_options(call: cst.Call) -> dict[str, cst.BaseExpression] | None:
    """`.cuda()` -> device "cuda"; `.cuda(1)` -> "cuda:1" (other arguments: not provable)."""
    device = arg(call, "device", 0)
    if any(a is not device and a.keyword and a.keyword.value != "non_blocking" for a in call.args):
        return None
    if device is None:
        return {"device": cst.SimpleString('"cuda"')}
    index = int_literal(device.value)
    return None if index is None else {"device": cst.SimpleString(f'"cuda:{index}"')}
