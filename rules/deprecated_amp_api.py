"""AO901: deprecated `torch.cuda.amp` / `torch.cpu.amp` entry points and
`torch.set_default_tensor_type`."""

from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import ImportItem

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.program.torch_api import torch_imports
from autoopt.lint.tree.nodes import dotted, nodes_of_type, string_value

# old qualified name -> (new function under `torch.`, device the old API implied)
_AMP = {
    "torch.cuda.amp.autocast": ("amp.autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("amp.autocast", "cuda"),
    "torch.cuda.amp.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cuda"),
    "torch.cpu.amp.autocast": ("amp.autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("amp.autocast", "cpu"),
    "torch.cpu.amp.GradScaler": ("amp.GradScaler", "cpu"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("amp.GradScaler", "cpu"),
}
# The old autocast took (enabled, dtype, cache_enabled) positionally; the new one takes the
# device first and then (dtype, enabled, cache_enabled): positional arguments become keywords.
_OLD_AUTOCAST_POSITIONS = ("enabled", "dtype", "cache_enabled")
_NEW_AMP = ("torch.amp.", "torch.autocast")
_SET_DEFAULT_TENSOR_TYPE = "torch.set_default_tensor_type"
_FLOAT_TYPES = {
    "torch.FloatTensor": "float32",
    "torch.DoubleTensor": "float64",
    "torch.HalfTensor": "float16",
    "torch.BFloat16Tensor": "bfloat16",
}
_CUDA_FLOAT_TYPES = {f"torch.cuda.{k.split('.')[-1]}": v for k, v in _FLOAT_TYPES.items()}
# modules whose `from X import ...` the fix can make unused
_OLD_MODULES = (
    "torch.cuda.amp",
    "torch.cpu.amp",
    "torch.cuda.amp.autocast_mode",
    "torch.cuda.amp.grad_scaler",
)


class DeprecatedAmpApi(Rule):
    """
    ## What it does
    Flags the deprecated device-specific AMP entry points `torch.cuda.amp.autocast(...)`,
    `torch.cuda.amp.GradScaler(...)` (and their `torch.cpu.amp` twins), however they were
    imported (`from torch.cuda.amp import autocast, GradScaler` included), also bound to a
    name and called through it (`amp_autocast = torch.cuda.amp.autocast`, then `with
    amp_autocast():`, T2T-ViT: reported where it is bound, without a fix), and
    `torch.set_default_tensor_type(...)`.

    ## Why
    Since torch 2.4 the `torch.cuda.amp` / `torch.cpu.amp` classes emit a `FutureWarning` on
    every construction (an `autocast()` inside the loop warns on every step) and are slated for
    removal; the device-generic `torch.amp.autocast("cuda", ...)` and
    `torch.amp.GradScaler("cuda", ...)` are the supported spelling (a widely read PyTorch tutorial still teaches the
    old one). `torch.set_default_tensor_type` is deprecated since torch 2.1 in favour of
    `torch.set_default_dtype` (and `torch.set_default_device`); a widely read PyTorch tutorial uses it to make
    float32 the default, which `set_default_dtype(torch.float32)` says directly.

    ## When not to
    - `torch.autocast`, `torch.amp.autocast` and a user's own `autocast` are not flagged.
    - The old spelling as the fallback of a `try:` that calls the new one (`try:
      torch.amp.GradScaler(device=device)` / `except (AttributeError, TypeError):
      torch.cuda.amp.GradScaler()`, timm's NativeScaler): it runs only on a torch older than
      the new API.
    - With `--target-version` below 2.4 the AMP calls are not flagged (no deprecation yet; the
      new `torch.amp.GradScaler` appeared in 2.3); below 2.1 nothing is.
    - `set_default_tensor_type(torch.cuda.FloatTensor)` also moves new tensors to the GPU:
      it is reported, but not rewritten, since that needs `set_default_device("cuda")` as well.

    ## Fix (safe)
    `torch.cuda.amp.autocast(args)` becomes `torch.amp.autocast("cuda", args)` (old positional
    arguments are passed by keyword, since the new signature puts `device_type` first),
    `torch.cuda.amp.GradScaler(args)` becomes `torch.amp.GradScaler("cuda", args)` — keeping the
    device the old API implied and every other argument — and
    `set_default_tensor_type(torch.FloatTensor)` becomes `set_default_dtype(torch.float32)`
    (likewise Double/Half/BFloat16). `import torch` is added when the file only had
    `from torch.cuda.amp import ...`, and that import is removed once nothing uses it.
    """

    code = "AO901"
    name = "deprecated-amp-api"
    message = "deprecated API; use torch.amp.autocast/GradScaler(device, ...) or set_default_dtype"
    fix_safety = FixSafety.SAFE
    fix_reason = "the torch.amp spelling with the same device and arguments behaves identically"
    triggers = ("cuda.amp", "cpu.amp", "import amp", "set_default_tensor_type")
    applies_to_versions = ((2, 1), None)

    VALID = [
        Valid(  # the class only compared, never built
            """
            import torch
            if isinstance(scaler, torch.cuda.amp.GradScaler):
                scaler.update()
            """
        ),
        Valid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                y = model(x)
            """
        ),
        Valid(  # a fallback for a torch without the new spelling (timm's NativeScaler)
            """
            import torch
            try:
                scaler = torch.amp.GradScaler(device=device)
            except (AttributeError, TypeError):
                scaler = torch.cuda.amp.GradScaler()
            """
        ),
        Valid(
            """
            def autocast():
                return contextlib.nullcontext()
            with autocast():
                y = model(x)
            """
        ),
        Valid(
            """
            import torch
            torch.set_default_dtype(torch.float32)
            """
        ),
    ]
    INVALID = [
        Invalid(  # referenced, then called through a name (T2T-ViT's `amp_autocast`)
            """
            import torch
            from contextlib import suppress
            amp_autocast = suppress
            if args.native_amp:
                amp_autocast = torch.cuda.amp.autocast
            with amp_autocast():
                loss = model(x)
            """,
            line=5,
            message_contains="referenced here, called later",
        ),
        Invalid(  # an `except` whose `try:` does not call the new spelling: no fallback
            """
            import torch
            try:
                import apex
            except ImportError:
                scaler = torch.cuda.amp.GradScaler()
            """,
            line=5,
            fixed="""
            import torch
            try:
                import apex
            except ImportError:
                scaler = torch.amp.GradScaler("cuda")
            """,
        ),
        Invalid(
            """
            from torch.cuda.amp import autocast, GradScaler
            scaler = GradScaler()
            for x, y in loader:
                with autocast():
                    loss = model(x).sum()
                scaler.scale(loss).backward()
            """,
            line=2,
            fixed="""
            import torch

            scaler = torch.amp.GradScaler("cuda")
            for x, y in loader:
                with torch.amp.autocast("cuda"):
                    loss = model(x).sum()
                scaler.scale(loss).backward()
            """,
        ),
        Invalid(
            """
            import torch as th
            scaler = th.cuda.amp.GradScaler(init_scale=1024)
            with th.cuda.amp.autocast(True, th.bfloat16):
                y = model(x)
            """,
            line=2,
            fixed="""
            import torch as th
            scaler = th.amp.GradScaler("cuda", init_scale=1024)
            with th.amp.autocast("cuda", enabled=True, dtype=th.bfloat16):
                y = model(x)
            """,
        ),
        Invalid(
            """
            import torch
            torch.set_default_tensor_type(torch.FloatTensor)
            """,
            line=2,
            fixed="""
            import torch
            torch.set_default_dtype(torch.float32)
            """,
        ),
        Invalid(
            """
            import torch
            torch.set_default_tensor_type(torch.cuda.FloatTensor)
            """,
            line=2,
            message_contains="set_default_device",
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast
            with autocast(dtype=torch.bfloat16):
                y = model(x)
            """,
            line=3,
            fixed="""
            import torch
            with torch.amp.autocast("cuda", dtype=torch.bfloat16):
                y = model(x)
            """,
        ),
    ]

    def visit_Attribute(self, node: cst.Attribute) -> None:
        """`amp_autocast = torch.cuda.amp.autocast`, called later as `amp_autocast()` (timm's
        and T2T-ViT's train.py): the old API referenced, not called here; reported without
        a fix (the call site is elsewhere)."""
        holder = self.parent(node)
        if isinstance(holder, cst.IfExp):  # `torch.cuda.amp.autocast if amp else suppress`
            holder = self.parent(holder)
        if not isinstance(holder, cst.Assign | cst.AnnAssign):
            return  # called here (visit_Call's), imported, or only compared (`isinstance`)
        names = self.qualified_names(node)
        amp = next((_AMP[n] for n in names if n in _AMP), None)
        if amp is None or self._fallback_of_the_new_api(node):
            return
        target = self.context.target_version
        if target is None or target >= (2, 4):
            new, device = amp
            self.report(
                node,
                f"`{dotted(node)}` is deprecated (referenced here, called later); use "
                f'`torch.{new}("{device}", ...)`, e.g. `functools.partial(torch.{new}, "{device}")`',
            )

    def visit_Call(self, node: cst.Call) -> None:
        names = self.qualified_names(node.func)
        amp = next((_AMP[n] for n in names if n in _AMP), None)
        if amp is not None:
            if self._fallback_of_the_new_api(node):
                return
            target = self.context.target_version
            if target is None or target >= (2, 4):
                self._report_amp(node, *amp)
        elif _SET_DEFAULT_TENSOR_TYPE in names:
            self._report_default_type(node)

    # ----- AMP --------------------------------------------------------------------------------
    def _fallback_of_the_new_api(self, node: cst.CSTNode) -> bool:
        """In the `except` of a `try:` that calls the new spelling (timm's NativeScaler:
        `torch.amp.GradScaler(device=...)`, else `torch.cuda.amp.GradScaler()` on a torch
        older than 2.3)."""
        previous: cst.CSTNode = node
        for anc in self.context.facts.ancestors(node):
            if isinstance(anc, cst.Try) and isinstance(previous, cst.ExceptHandler):
                return any(
                    name.startswith(_NEW_AMP)
                    for call in nodes_of_type(anc.body, cst.Call)
                    for name in self.qualified_names(call.func)
                )
            previous = anc
        return False

    def _report_amp(self, node: cst.Call, new: str, device: str) -> None:
        torch_expr, imports = self._torch_root(node.func)
        args = list(node.args)
        if new == "amp.autocast":
            args = [
                a.with_changes(keyword=cst.Name(_OLD_AUTOCAST_POSITIONS[i]), equal=_EQUAL)
                if a.keyword is None and not a.star and i < len(_OLD_AUTOCAST_POSITIONS)
                else a
                for i, a in enumerate(args)
            ]
        device_arg = cst.Arg(
            cst.SimpleString(f'"{device}"'),
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            if args
            else (cst.MaybeSentinel.DEFAULT),
        )
        new_call = node.with_changes(func=_attr_chain(torch_expr, new), args=[device_arg, *args])
        old = dotted(node.func) or "the old API"
        self.report(
            node,
            f'`{old}` is deprecated; use `torch.{new}("{device}", ...)`',
            fix=Fix(
                replacements={node: new_call},
                description=f'use torch.{new}("{device}", ...)',
                add_imports=imports,
                remove_imports=self._stale_imports(),
            ),
        )

    # ----- set_default_tensor_type ----------------------------------------------------------------
    def _report_default_type(self, node: cst.Call) -> None:
        if len(node.args) != 1 or node.args[0].star:
            self.report(
                node, "`torch.set_default_tensor_type` is deprecated; use set_default_dtype"
            )
            return
        value = node.args[0].value
        text = string_value(value)
        names = {text} if text is not None else self.qualified_names(value)
        dtype = next((_FLOAT_TYPES[n] for n in names if n in _FLOAT_TYPES), None)
        cuda_dtype = next((_CUDA_FLOAT_TYPES[n] for n in names if n in _CUDA_FLOAT_TYPES), None)
        if dtype is None:
            extra = (
                f'torch.set_default_dtype(torch.{cuda_dtype}) and torch.set_default_device("cuda")'
                if cuda_dtype is not None
                else "torch.set_default_dtype(...)"
            )
            self.report(node, f"`torch.set_default_tensor_type` is deprecated; use {extra}")
            return
        torch_expr, imports = self._torch_root(node.func)
        new_call = node.with_changes(
            func=_attr_chain(torch_expr, "set_default_dtype"),
            args=[node.args[0].with_changes(value=_attr_chain(torch_expr, dtype))],
        )
        self.report(
            node,
            f"`torch.set_default_tensor_type` is deprecated; use "
            f"`torch.set_default_dtype(torch.{dtype})`",
            fix=Fix(
                replacements={node: new_call},
                description=f"use torch.set_default_dtype(torch.{dtype})",
                add_imports=imports,
            ),
        )

    # ----- helpers --------------------------------------------------------------------------------
    def _torch_root(
        self, func: cst.BaseExpression
    ) -> tuple[cst.BaseExpression, tuple[ImportItem, ...]]:
        """The expression naming the torch module in the file: the call's own root (`th` in
        `th.cuda.amp.autocast`) when it is one, else `torch` plus the import it needs."""
        root = func
        while isinstance(root, cst.Attribute):
            root = root.value
        if isinstance(root, cst.Name) and "torch" in self.qualified_names(root):
            return cst.Name(root.value), ()
        return cst.Name("torch"), torch_imports(self.context.module)

    def _stale_imports(self) -> tuple[ImportItem, ...]:
        """Every `from <old amp module> import X` (and `from torch.cuda import amp`): removed by
        the rewriter only if nothing uses them any more."""
        items: list[ImportItem] = []
        for stmt in self.context.module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                    continue
                module = dotted(small.module) if small.module is not None else None
                if small.relative or module is None:
                    continue
                for alias in small.names:
                    obj = dotted(alias.name)
                    asname = (
                        dotted(alias.asname.name)
                        if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                        else None
                    )
                    if obj is None:
                        continue
                    if module in _OLD_MODULES or (
                        module in ("torch.cuda", "torch.cpu") and obj == "amp"
                    ):
                        items.append(ImportItem(module, obj, asname))
        return tuple(items)


_EQUAL = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


def _attr_chain(root: cst.BaseExpression, path: str) -> cst.BaseExpression:
    """`root.a.b` for path "a.b"."""
    expr = root
    for part in path.split("."):
        expr = cst.Attribute(value=expr, attr=cst.Name(part))
    return expr
