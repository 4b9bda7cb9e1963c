"""AO902: `torch.load` that may unpickle arbitrary code from a file it does not control."""

from __future__ import annotations

import libcst as cst

from autoopt.lint.engine.rule import Fix, FixSafety, Invalid, Rule, Valid
from autoopt.lint.tree.calls import arg, with_keyword
from autoopt.lint.tree.nodes import is_name, string_value

_LOAD = ("torch.load", "torch.serialization.load")
_SAFE_DEFAULT = (2, 6)  # torch.load defaults to weights_only=True since 2.6


class TorchLoadWeightsOnly(Rule):
    """
    ## What it does
    Flags `torch.load(path, weights_only=False)`, and `torch.load(path)` without
    `weights_only` for code targeting torch before 2.6 (`--target-version`), when `path` is
    not a string literal written in the project.

    ## Why is this bad?
    With `weights_only=False` torch.load is `pickle.load`: a checkpoint can run any code on the
    machine that loads it (a downloaded model, a path from the command line, a shared
    filesystem). `weights_only=True` restricts unpickling to tensors, primitive types and
    allow-listed classes; torch made it the default in 2.6 for this reason.

    ## Example
    `state = torch.load(args.checkpoint, weights_only=False)`

    ## Use instead
    `state = torch.load(args.checkpoint, weights_only=True)`

    ## Fix safety
    Unsafe: checkpoints that pickle other objects (a whole `nn.Module`, an `argparse.Namespace`,
    numpy arrays on older torch, custom classes) stop loading with an `UnpicklingError`; allow
    their classes with `torch.serialization.add_safe_globals([...])` or save a `state_dict`.

    ## When not to
    - A literal path of the project (`torch.load("weights/base.pt")`): its content is part of
      the repository. Not flagged.
    - `pickle_module=` given, or options hidden in `**kwargs`: the author chose the unpickler.
    - Code targeting torch 2.6+ (or an unknown version) that does not pass `weights_only=False`.
    """

    code = "AO902"
    name = "torch-load-weights-only"
    message = "torch.load with weights_only=False unpickles arbitrary code; pass weights_only=True"
    fix_safety = FixSafety.UNSAFE
    fix_reason = "checkpoints holding pickled objects other than tensors stop loading"
    applies_to_versions = ((1, 13), None)  # weights_only exists since torch 1.13
    triggers = ("torch.load(", "import load", "serialization.load(")

    VALID = [
        Valid(
            """
            import torch
            a = torch.load(path, weights_only=True)
            b = torch.load("checkpoints/base.pt", weights_only=False)
            c = torch.load(path)
            d = torch.load(path, pickle_module=dill, weights_only=False)
            e = torch.load(path, **load_kwargs)
            """
        ),
        Valid(  # a user's own `load`
            """
            def load(p, weights_only):
                return open(p).read()
            cfg = load(path, weights_only=False)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """
            import torch
            state = torch.load(args.resume, map_location="cpu", weights_only=False)
            """,
            line=2,
            fixed="""
            import torch
            state = torch.load(args.resume, map_location="cpu", weights_only=True)
            """,
            unsafe=True,
        ),
        Invalid(
            """
            from torch import load
            state = load(f"runs/{name}/last.pt")
            """,
            line=2,
            target_version="2.4",
            message_contains="before torch 2.6",
            fixed="""
            from torch import load
            state = load(f"runs/{name}/last.pt", weights_only=True)
            """,
            unsafe=True,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_call_to(node, *_LOAD) or any(a.star == "**" for a in node.args):
            return
        path = arg(node, "f", 0)
        if path is None or string_value(path.value) is not None:  # a literal of the project
            return
        if arg(node, "pickle_module", 2) is not None:
            return
        given = arg(node, "weights_only")
        message = None
        if given is None:
            version = self.context.target_version
            if version is None or version >= _SAFE_DEFAULT:
                return
            message = (
                "torch.load defaults to weights_only=False before torch 2.6 and unpickles"
                " arbitrary code; pass weights_only=True"
            )
        elif not is_name(given.value, "False"):
            return
        new = with_keyword(node, "weights_only", cst.Name("True"))
        self.report(
            node, message, fix=Fix(replacements={node: new}, description="weights_only=True")
        )
